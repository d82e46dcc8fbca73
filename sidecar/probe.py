"""One probe of a failing store for every lease of a sidecar (docs/design.md, "a good
neighbour").

While the store refuses (a request answered `StoreUnavailable`: unreachable, timed out, 429 or
5xx), nothing of the sidecar's that can wait sends: followers do not try to acquire, loss
markers are not written, the candidate beat pauses. One probe — a read, once per retry period,
jittered, never before the store's ``Retry-After`` — tells them all when the store is back,
and they resume the moment any request (the probe's, or a leader's renewal) is answered.

A leader's renewals do not wait for the probe: each retries on its own while its deadline is
ahead (rule 3), waiting for a ``Retry-After`` only as long as its deadline allows
(`Elector`). So a sidecar with 1,000 leases sends, once its leaders have renewed or stepped
down, one request per retry period to a store that is already failing — not 1,000.

Liveness only: the probe delays attempts, it never grants or extends anything.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from sidecar.backends.base import StoreError, StoreUnavailable
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log

logger = logging.getLogger("sidecar.probe")


class StoreProbe:
    """Whether the store is refusing, and the one loop that probes it while it does.

    Every request of the sidecar reports its outcome: `answered` (any answer about a lease,
    a refusal included) or `refused` (nothing known). ``read`` is the probe itself: any cheap
    read of the store (one lease's record)."""

    def __init__(
        self,
        read: Callable[[], Awaitable[object]],
        retry_period: float,
        request_timeout: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        count: Callable[[str, str, float], None] = lambda op, outcome, seconds: None,
        spawn: Callable[[str, Callable[[], Awaitable[None]]], asyncio.Task[None]] | None = None,
    ) -> None:
        self._read = read
        self.retry_period = retry_period
        self.request_timeout = request_timeout
        self._clock = clock
        self._rng = rng or random.Random()
        self._count = count  # store requests, into the sidecar's metrics (op "probe")
        self.refusing = False
        self.last_error: str | None = None  # the refusal that started this outage (/readyz)
        self.not_before = float("-inf")  # the store's Retry-After, as a monotonic moment
        self.probes = 0  # probe reads sent (for tests and logs)
        self._refusing_since = 0.0
        self._back = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        # How the probe's task is started: under the sidecar's supervisor (`sidecar.supervisor`),
        # or a plain task (tests).
        self._spawn = spawn or _plain_task

    def on_back(self, listener: Callable[[], None]) -> None:
        """``listener`` is called (synchronously, must not block) when the store answers again
        after refusing: what was waiting resumes."""
        self._listeners.append(listener)

    # -- what every request reports --------------------------------------------------------

    def answered(self) -> None:
        """A request got an answer: the store is back (if it was not)."""
        if not self.refusing:
            return
        self.refusing = False
        self.last_error = None
        log(
            logger,
            "info",
            "the store answers again; every lease resumes",
            refused_for_seconds=round(self._clock.now() - self._refusing_since, 3),
            probes=self.probes,
        )
        back, self._back = self._back, asyncio.Event()
        back.set()
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                logger.exception("a listener of the store probe failed")

    def refused(self, error: StoreError) -> None:
        """A request failed with nothing known: from now on only the probe (and leaders'
        renewals) ask the store, until an answer comes."""
        now = self._clock.now()
        retry_after = error.retry_after if isinstance(error, StoreUnavailable) else None
        if retry_after is not None and retry_after > 0:
            self.not_before = max(self.not_before, now + retry_after)
        if self.refusing:
            return
        self.refusing = True
        self.last_error = str(error)
        self._refusing_since = now
        log(
            logger,
            "warning",
            "the store refuses; one probe per retry period asks for every lease until it "
            "answers (leaders keep renewing while their deadlines allow)",
            error=str(error),
            retry_period_seconds=self.retry_period,
            retry_after_seconds=retry_after,
        )
        if self._task is None or self._task.done():
            self._task = self._spawn("store-probe", self._probe)

    # -- waiting ---------------------------------------------------------------------------

    async def wait(self) -> None:
        """Return once the store answers (at once if it is not refusing)."""
        if self.refusing:
            await self._back.wait()

    def wait_after(self, now: float) -> float:
        """Seconds a request that can wait (not a renewal) should still wait for the store's
        ``Retry-After`` (0: none, or past)."""
        return max(0.0, self.not_before - now)

    # -- the probe -------------------------------------------------------------------------

    async def _probe(self) -> None:
        """One read per retry period (jittered, never before ``Retry-After``) while the store
        refuses; ends when it answers."""
        while self.refusing:
            now = self._clock.now()
            at = max(now + self.retry_period * self._rng.uniform(1.0, 1.5), self.not_before)
            await asyncio.sleep(at - now)
            if self._answered_meanwhile():  # a renewal got through
                return
            started = self._clock.now()
            self.probes += 1
            try:
                async with asyncio.timeout(self.request_timeout):
                    await self._read()
            except (StoreError, TimeoutError) as exc:
                failed = exc if isinstance(exc, StoreError) else StoreUnavailable("timed out")
                self._count("probe", "timeout" if isinstance(exc, TimeoutError) else "unavailable",
                            self._clock.now() - started)  # fmt: skip
                self.refused(failed)
                continue
            except Exception as exc:  # a bug in a store: keep probing, never end the loop
                logger.exception("the store probe failed unexpectedly")
                self._count("probe", "error", self._clock.now() - started)
                self.refused(StoreUnavailable(f"{type(exc).__name__}: {exc}"))
                continue
            self._count("probe", "ok", self._clock.now() - started)
            self.answered()

    def _answered_meanwhile(self) -> bool:
        return not self.refusing

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _plain_task(name: str, work: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    """The probe's task outside a supervisor (tests)."""

    async def run() -> None:
        await work()

    return asyncio.create_task(run(), name=name)
