"""How a store's background loops wait after a failure (a watch stream, a pub/sub or LISTEN
connection, a read retried until it answers): one `Backoff`, and `reconnect_forever`, the loop
that keeps one such connection.

Waits double from the first to the longest, each jittered (a fleet of sidecars that lost the
same server does not come back in step), and start over either when the loop says the
connection worked (`Backoff.succeeded`) or, as client-go's reflector does, only after a quiet
spell without a failure (``reset_after``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import NoReturn

from sidecar.clock import SYSTEM_CLOCK, Clock


class Backoff:
    """Each failure waits its step times a factor drawn from ``jitter`` and multiplies the step
    by ``factor``, up to ``cap``. With ``reset_after``, the step goes back to ``initial`` only
    after that many seconds without a failure, counted from the end of the last wait (then
    `succeeded` is not called)."""

    def __init__(
        self,
        initial: float,
        cap: float,
        *,
        factor: float = 2.0,
        jitter: tuple[float, float] = (0.5, 1.0),
        reset_after: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rng = rng  # None: the random module's own generator
        self._step = initial
        self._quiet_since = float("-inf")  # when the retry after the latest failure began

    def failed(self) -> float:
        """A failure now: the seconds to wait before the next try."""
        now = self._clock.now() if self.reset_after is not None else 0.0
        if self.reset_after is not None and now - self._quiet_since >= self.reset_after:
            self._step = self.initial  # healthy long enough: start over
        step = self._step
        self._step = min(self.cap, step * self.factor)
        uniform = self._rng.uniform if self._rng is not None else random.uniform
        delay = step * uniform(*self.jitter)
        self._quiet_since = now + delay
        return delay

    def succeeded(self) -> None:
        """The connection worked: the next failure waits the first step again."""
        self._step = self.initial


async def reconnect_forever(
    connect: Callable[[], Awaitable[None]],
    *,
    backoff: Backoff,
    failed: Callable[[Exception], None],
    wanted: Callable[[], Awaitable[None]] | None = None,
    opening: Callable[[], None] | None = None,
    closed: Callable[[], Awaitable[None]] | None = None,
    fatal: tuple[type[Exception], ...] = (),
) -> NoReturn:
    """Keep one connection until cancelled: wait until it is ``wanted`` (someone watches),
    make its client-side object (``opening``: its failure is a bug, raised), ``connect`` and
    serve until it returns (the back-off starts over) or fails (``failed`` is told), then
    ``closed``, then, after a failure, the back-off's wait. ``closed`` comes before the wait
    so that nothing reports the connection up while it is down. Never raises but
    CancelledError, ``fatal`` and what ``opening`` raises (bugs, for the supervisor to
    restart the loop)."""
    while True:
        if wanted is not None:
            await wanted()
        if opening is not None:
            opening()
        wait = 0.0
        try:
            await connect()
            backoff.succeeded()
        except fatal:
            raise
        except Exception as exc:  # never raise: the watches rely on the connection
            failed(exc)
            wait = backoff.failed()
        finally:
            if closed is not None:
                await closed()
        if wait:
            await asyncio.sleep(wait)
