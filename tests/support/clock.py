"""A clock the test moves by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._wall = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

    def now(self) -> float:
        return self._now

    def wall(self) -> datetime:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._wall += timedelta(seconds=seconds)


async def run_alone(elector: object) -> None:
    """An elector alone on a scheduler of its own, as a sidecar of one lease runs it (its
    `LeaseSet` runs every elector on one `Scheduler`)."""
    from sidecar.elector import Elector
    from sidecar.schedule import Scheduler

    assert isinstance(elector, Elector)
    await Scheduler([elector], clock=elector.clock).run()
