"""A leader's renewal gaps: the time since its last renewal was sent, and one alert once that
passes half the lease — the warning that comes before a deadline demotion (rule 3).

An episode ends with the next successful renewal; within one, the alert is raised once: as the
gap grows (the half-lease timer, a renewal still out or failing, the deadline demotion it ends
in) or when a renewal lands late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from sidecar.clock import Clock
from sidecar.logs import log
from sidecar.metrics import Metrics
from sidecar.status import GapAlert, LeaderStatus, Role
from sidecar.timing import Timing

logger = logging.getLogger("sidecar.elector")  # the elector's lines: operators filter on it


class Renewer(Protocol):
    """What the gap alerts read of their lease (`sidecar.elector.Elector`)."""

    @property
    def lease(self) -> str: ...

    @property
    def timing(self) -> Timing: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def role(self) -> Role: ...

    @property
    def last_error(self) -> str | None: ...

    @property
    def renewal_out(self) -> float | None:
        """When the renewal now in flight was sent; None while none is."""
        ...

    def status(self) -> LeaderStatus: ...


class RenewalGaps:
    __slots__ = ("_listeners", "_owner", "alerted", "last_sent")

    def __init__(self, owner: Renewer) -> None:
        self._owner = owner
        self.last_sent = float("-inf")  # when the last grant or renewal of this reign was sent
        self.alerted = False  # this episode's alert is raised
        # A tuple, the empty one shared: a list cost ~90 bytes more per lease.
        self._listeners: tuple[Callable[[GapAlert], None], ...] = ()

    def on_alert(self, listener: Callable[[GapAlert], None]) -> None:
        self._listeners = (*self._listeners, listener)

    @property
    def half_mark(self) -> float:
        """The moment the gap passes half the lease."""
        return self.last_sent + self._owner.timing.lease_duration / 2

    def since_last(self) -> float:
        return max(0.0, self._owner.clock.now() - self.last_sent)

    def began(self, sent: float) -> None:
        """A reign began with a grant sent at ``sent``: a new episode."""
        self.last_sent = sent
        self.alerted = False

    def renewed(self, sent: float) -> None:
        """A renewal sent at ``sent`` landed: its gap is counted (and alerted if it was past half
        the lease and nothing alerted yet), and the episode ends."""
        gap = sent - self.last_sent
        self._owner.metrics.renewal_gap.observe(gap)
        if gap > self._owner.timing.lease_duration / 2 and not self.alerted:
            self._alert(gap, growing=False)
        self.alerted = False
        self.last_sent = sent

    def alarm(self) -> asyncio.TimerHandle:
        """A renewal still in flight at the half-lease mark is a growing gap too: alert on time,
        not when (or if) the request comes back — also where no scheduler's timer watches.
        (+10 ms: asyncio may run a timer up to one clock resolution early.) Cancel it when the
        renewal is done."""
        clock = self._owner.clock
        return asyncio.get_running_loop().call_later(
            max(0.0, self.half_mark - clock.now()) + 0.01,
            lambda: self.check(clock.now()),
        )

    def check(self, now: float) -> None:
        """Alert a gap still growing past half the lease, once an episode."""
        if self._owner.role is not Role.LEADER or self.alerted:
            return
        gap = now - self.last_sent
        if gap > self._owner.timing.lease_duration / 2:
            self._alert(gap, growing=True)

    def _alert(self, gap: float, *, growing: bool) -> None:
        self.alerted = True
        owner = self._owner
        owner.metrics.gap_over_half_lease.inc()
        last_error = owner.last_error
        out = owner.renewal_out
        if last_error is None and out is not None:
            waited = owner.clock.now() - out
            last_error = f"renewal sent {waited:.3f}s ago, no answer yet"
        lease_duration = owner.timing.lease_duration
        log(
            logger,
            "warning",
            "renewal gap past half the lease",
            lease=owner.lease,
            gap_seconds=round(gap, 3),
            lease_duration_seconds=lease_duration,
            still_growing=growing,
            last_error=last_error,
        )
        alert = GapAlert(gap, lease_duration, growing, last_error, owner.status())
        for listener in self._listeners:
            try:
                listener(alert)
            except Exception:
                logger.exception("gap alert listener failed")
