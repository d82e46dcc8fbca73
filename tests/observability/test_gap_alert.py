"""The in-process renewal-gap alert: a gap past half the lease — finished, or still growing —
logs one warning, counts once and notifies the listeners once per episode; an episode ends
with the next successful renewal (or a new grant), and the next long gap is a new one.

Lease 10 s, renew every 3 s: half the lease is 5 s, the deadline 8.9 s after a renewal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.status import GapAlert, Role
from sidecar.timing import Timing
from tests.observability.fakes import FakeClock, FlakyStore
from tests.support.clock import run_alone

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)
HALF = TIMING.lease_duration / 2
WARNING = "renewal gap past half the lease"


class Rig:
    """One elector on a flaky in-memory store, with everything the alert emits collected."""

    def __init__(self, timing: Timing = TIMING, clock: Clock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.store = FlakyStore(MemoryLeaseStore(MemoryLeaseState(self.clock), "unit"))
        self.registry = CollectorRegistry()
        self.elector = Elector(
            self.store,
            timing,
            "a_0001",
            "unit",
            metrics=Metrics(self.registry, "unit", timing.lease_duration),
            clock=self.clock,
            rng=random.Random(3),
        )
        self.alerts: list[GapAlert] = []
        self.elector.on_gap_alert(self.alerts.append)

    def counted(self) -> float | None:
        return self.registry.get_sample_value(
            "leader_sidecar_renewal_gap_over_half_lease_total",
            {"lease": "unit", "lease_group": "unit"},
        )

    def gauge(self, name: str) -> float | None:
        return self.registry.get_sample_value(name, {"lease": "unit", "lease_group": "unit"})

    def advance(self, seconds: float) -> None:
        assert isinstance(self.clock, FakeClock)
        self.clock.advance(seconds)

    def tick(self) -> None:
        """What the run loop does on every wake-up, without I/O."""
        self.elector.tick(self.clock.now())

    async def lead(self) -> None:
        await self.elector.step()
        assert self.elector.is_leader()

    async def renew_after(self, seconds: float) -> None:
        self.advance(seconds)
        await self.elector.step()


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == WARNING and r.levelno == logging.WARNING]


def fields(record: logging.LogRecord) -> dict[str, object]:
    return dict(record.sidecar_fields)  # type: ignore[attr-defined]


@pytest.fixture
def rig() -> Rig:
    return Rig()


async def test_a_finished_gap_past_half_the_lease_alerts_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that succeeds 6 s after the previous one: one warning, one count, one
    listener call marked as finished; the on-time renewals after it add nothing."""
    await rig.lead()
    await rig.renew_after(6.0)
    for _ in range(4):
        await rig.renew_after(3.0)

    assert rig.counted() == 1.0
    assert [(a.growing, a.gap, a.lease_duration) for a in rig.alerts] == [(False, 6.0, 10.0)]
    (record,) = warnings_logged(caplog)
    expected = {
        "lease": "unit",
        "gap_seconds": 6.0,
        "lease_duration_seconds": 10.0,
        "still_growing": False,
        "last_error": None,
    }
    assert {key: fields(record).get(key) for key in expected} == expected
    assert rig.alerts[0].status.leader is True


async def test_each_long_gap_between_good_renewals_is_a_new_episode(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Two long gaps separated by a normal renewal alert twice; two in a row alert twice
    too (the renewal between them ended the first episode)."""
    await rig.lead()
    await rig.renew_after(6.0)
    await rig.renew_after(3.0)
    await rig.renew_after(5.5)
    await rig.renew_after(7.0)
    assert rig.counted() == 3.0
    assert [a.gap for a in rig.alerts] == [6.0, 5.5, 7.0]
    assert len(warnings_logged(caplog)) == 3


async def test_a_gap_of_exactly_half_the_lease_does_not_alert(rig: Rig) -> None:
    """The threshold is strictly past half, like the histogram's half-lease bucket edge:
    neither a finished gap of 5 s nor a growing one at 5 s alerts; 5.001 s does."""
    await rig.lead()
    await rig.renew_after(HALF)
    rig.advance(HALF)
    rig.tick()
    assert rig.counted() == 0.0
    assert rig.alerts == []
    rig.advance(0.001)
    rig.tick()
    assert rig.counted() == 1.0
    assert (
        rig.registry.get_sample_value(
            "leader_sidecar_renewal_gap_seconds_bucket",
            {"lease": "unit", "lease_group": "unit", "le": "5.0"},
        )
        == 1.0
    )


async def test_a_gap_still_growing_alerts_once_however_often_the_loop_wakes(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewals fail from 3 s on; crossing 5 s alerts once (still growing, with the last
    store error); further ticks and failed renewals until the deadline add nothing, and the
    renewal that finally succeeds does not alert the same gap again."""
    await rig.lead()
    rig.store.down = True
    await rig.renew_after(3.0)  # fails; 3 s is not past half
    rig.tick()
    assert rig.alerts == []

    rig.advance(2.5)  # 5.5 s without a renewal
    rig.tick()
    assert rig.counted() == 1.0
    (alert,) = rig.alerts
    assert alert.growing is True
    assert alert.gap == 5.5
    assert alert.last_error is not None
    assert "connection refused (test)" in alert.last_error

    for _ in range(6):  # the loop waking every half second, retrying every second
        rig.advance(0.5)
        rig.tick()
        await rig.elector.step()
    assert rig.elector.is_leader()  # 8.5 s: the deadline (8.9 s) is still ahead

    rig.store.down = False
    await rig.elector.step()  # succeeds: a finished 8.5 s gap, already alerted
    assert rig.elector.is_leader()
    assert rig.counted() == 1.0
    assert len(rig.alerts) == 1
    (record,) = warnings_logged(caplog)
    assert fields(record)["still_growing"] is True
    assert fields(record)["gap_seconds"] == 5.5
    assert "connection refused (test)" in str(fields(record)["last_error"])


async def test_a_failed_renewal_alerts_a_growing_gap_without_waiting_for_a_tick(
    rig: Rig,
) -> None:
    """The renewal that fails past half the lease raises the alert itself."""
    await rig.lead()
    rig.store.down = True
    await rig.renew_after(6.0)
    assert rig.counted() == 1.0
    assert [(a.growing, a.gap) for a in rig.alerts] == [(True, 6.0)]


async def test_the_next_growing_gap_after_a_good_renewal_alerts_again(rig: Rig) -> None:
    """Episode 1 ends with a successful renewal; the next stall is episode 2."""
    await rig.lead()
    rig.store.down = True
    rig.advance(6.0)
    rig.tick()
    rig.store.down = False
    await rig.elector.step()
    await rig.renew_after(3.0)
    assert rig.counted() == 1.0

    rig.store.down = True
    rig.advance(5.1)
    rig.tick()
    rig.advance(1.0)
    rig.tick()
    assert rig.counted() == 2.0
    assert [(a.growing, round(a.gap, 6)) for a in rig.alerts] == [(True, 6.0), (True, 5.1)]


async def test_a_gap_that_ends_in_demotion_and_a_new_term_starts_a_new_episode(
    rig: Rig,
) -> None:
    """Alerted once while growing, demoted at the deadline (no second alert), re-elected
    under a new term; the next long gap alerts again."""
    await rig.lead()
    first_term = rig.elector.status().term
    rig.store.down = True
    rig.advance(5.5)
    rig.tick()
    rig.advance(4.0)  # 9.5 s: past the 8.9 s deadline
    rig.tick()
    assert rig.elector.role is Role.FOLLOWER
    assert rig.counted() == 1.0
    assert rig.gauge("leader_sidecar_since_renewal_seconds") == 0.0

    rig.store.down = False
    rig.advance(1.0)  # the record still names us, who no longer lead: taken back at once
    await rig.lead()
    assert rig.elector.status().term > first_term
    rig.store.down = True
    rig.advance(5.5)
    rig.tick()
    assert rig.counted() == 2.0
    assert [a.growing for a in rig.alerts] == [True, True]


async def test_a_follower_never_alerts(rig: Rig) -> None:
    """No lease, no renewal gap: a follower whose store is down for long stays quiet."""
    other = Elector(
        FlakyStore(rig.store.inner),
        TIMING,
        "b_0002",
        "unit",
        metrics=Metrics(CollectorRegistry(), "unit", TIMING.lease_duration),
        clock=rig.clock,
    )
    await other.step()  # b leads
    await rig.elector.step()  # a follows
    assert rig.elector.role is Role.FOLLOWER
    rig.store.down = True
    for _ in range(30):
        rig.advance(1.0)
        rig.tick()
        await rig.elector.step()
    assert rig.elector.role is Role.FOLLOWER
    assert rig.counted() == 0.0
    assert rig.alerts == []


async def test_seconds_since_renewal_is_read_at_scrape_time(rig: Rig) -> None:
    """It grows with the clock between renewals, without any store call or tick, and reads 0
    on a follower — under its name and, for one release, the name before issue 32."""

    def both() -> list[float | None]:
        return [
            rig.gauge("leader_sidecar_since_renewal_seconds"),
            rig.gauge("leader_sidecar_seconds_since_renewal"),
        ]

    assert both() == [0.0, 0.0]
    await rig.lead()
    rig.advance(2.0)
    assert both() == [2.0, 2.0]
    rig.advance(4.5)
    assert both() == [6.5, 6.5]
    await rig.elector.step()
    assert both() == [0.0, 0.0]


async def test_a_listener_that_raises_does_not_stop_the_alert(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken listener (say, the Kubernetes Event recorder) is logged; the count, the
    warning and the other listeners still happen."""

    def broken(_: GapAlert) -> None:
        raise RuntimeError("boom")

    later: list[GapAlert] = []
    rig.elector.on_gap_alert(broken)
    rig.elector.on_gap_alert(later.append)
    await rig.lead()
    await rig.renew_after(6.0)
    assert rig.counted() == 1.0
    assert len(rig.alerts) == 1
    assert len(later) == 1
    assert len(warnings_logged(caplog)) == 1


# -- the real loop ----------------------------------------------------------------------------


async def wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def leading_on_a_hung_store(timing: Timing) -> AsyncIterator[Rig]:
    """An elector running on the real clock that led, then its store hangs every request."""
    rig = Rig(timing, SYSTEM_CLOCK)
    task = asyncio.create_task(run_alone(rig.elector))
    try:
        await wait_for(rig.elector.is_leader, timeout=5)
        rig.store.hung = True
        yield rig
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_run_loop_alerts_a_hung_store_at_the_half_lease_mark() -> None:
    """With the store hanging, the loop's next retry would come only well after half the lease;
    the loop wakes at the half-lease mark instead, so the growing gap is alerted on time."""
    timing = Timing(lease_duration=2.0, renew_interval=0.6, retry_period=0.5, request_timeout=0.3)
    async with leading_on_a_hung_store(timing) as rig:
        # Renewal sent at +0.6 s hangs until +0.9 s; the retry comes at +1.4 … +1.65 s. The
        # half-lease mark is +1.0 s.
        await wait_for(lambda: bool(rig.alerts), timeout=5)
        (alert,) = rig.alerts
        assert alert.growing is True
        assert 1.0 < alert.gap < 1.3, alert.gap
        assert rig.counted() == 1.0
        await wait_for(lambda: rig.elector.role is Role.FOLLOWER, timeout=5)
        assert rig.counted() == 1.0  # the demotion at the deadline adds no second alert
        assert (
            rig.registry.get_sample_value(
                "leader_sidecar_demotions_total",
                {"lease": "unit", "lease_group": "unit", "reason": "deadline"},
            )
            == 1.0
        )


async def test_a_gap_alerted_while_the_renewal_is_out_says_it_is_waiting_for_an_answer() -> None:
    """At the half-lease mark the renewal sent at +0.6 s is still out (it times out at
    +1.15 s): the alert cannot name a store error yet, so it names the unanswered renewal and
    how long it has waited, not "no error"."""
    timing = Timing(lease_duration=2.0, renew_interval=0.6, retry_period=0.5, request_timeout=0.55)
    async with leading_on_a_hung_store(timing) as rig:
        await wait_for(lambda: bool(rig.alerts), timeout=5)
        (alert,) = rig.alerts
        assert alert.growing is True
        assert alert.last_error is not None
        assert alert.last_error.startswith("renewal sent 0.")
        assert alert.last_error.endswith("s ago, no answer yet")
