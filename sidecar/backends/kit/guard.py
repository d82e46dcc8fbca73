"""How a store client reports failures: one log line per distinct problem (not one per request
or per lease: a thousand leases failing together say it once), one line when the store answers
again, and every failure of a request that is not an answer about the lease raised as
`StoreUnavailable`, as the contract asks."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sidecar.backends.base import StoreError, StoreUnavailable
from sidecar.logs import log

T = TypeVar("T")


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first: what a failure report explains (the TLS or
    DNS error under a client library's connection error)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


class Guard:
    """The failure report of one store client. ``store`` names it in log lines ("redis"),
    ``where`` says which server it talks to now."""

    def __init__(self, store: str, logger: logging.Logger, where: Callable[[], str]) -> None:
        self._store = store
        self._logger = logger
        self._where = where
        self.failing: str | None = None  # the problem last logged, until a request succeeds
        self._answered = True  # the last request got an answer (see `outage_begins`)

    def report(self, level: str, problem: str, error: str) -> None:
        """Log ``error`` unless ``problem`` (what makes two failures the same one) was the
        last one logged and no request succeeded since."""
        if problem != self.failing:
            log(self._logger, level, f"{self._store} unavailable", store=self._where(),
                error=error)  # fmt: skip
            self.failing = problem

    def answered(self) -> None:
        """A request got its answer: the outage, if any, is over."""
        self._answered = True
        if self.failing is not None:
            log(self._logger, "info", f"{self._store} answers again", store=self._where())
            self.failing = None

    def outage_begins(self) -> bool:
        """True for the first failure after an answer, once: what a client's epoch is bumped
        on, so that a thousand leases' requests failing one after another do not keep
        restarting every follower's count (safe: between two failures without an answer, no
        request observed anything)."""
        first, self._answered = self._answered, False
        return first

    async def run(
        self,
        work: Callable[[], Awaitable[T]],
        failed: Callable[[Exception], StoreUnavailable],
    ) -> T:
        """Run one request: a `StoreError` (an answer, or a failure said already) passes
        through; any other failure becomes the `StoreUnavailable` that ``failed`` makes of it."""
        try:
            return await work()
        except StoreError:
            raise
        except Exception as exc:  # the client library, the socket, TLS, a malformed answer
            raise failed(exc) from exc
