"""Clocks. Deadlines use a monotonic clock that keeps counting while the host is suspended;
wall time is only for what humans read (logs, ``since``, Kubernetes ``renewTime``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds. Never goes back; counts through suspend."""
        ...

    def wall(self) -> datetime:
        """Timezone-aware UTC wall time, for humans."""
        ...


def boottime() -> float:
    """CLOCK_BOOTTIME: like CLOCK_MONOTONIC, but it keeps counting while the host sleeps, so a
    lease deadline cannot outlive a suspend. One clock for every process on this host."""
    return time.clock_gettime(_BOOTTIME)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class SystemClock:
    def now(self) -> float:
        return boottime()

    def wall(self) -> datetime:
        return datetime.now(UTC)


SYSTEM_CLOCK = SystemClock()


def iso_utc(moment: datetime | None) -> str | None:
    """``2026-11-29T09:00:00.123Z`` (millisecond precision), or None."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
