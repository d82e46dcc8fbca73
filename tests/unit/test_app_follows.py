"""Leadership follows the app (docs/design.md): replicas on the in-memory store, in real
(short) time, each with an app check the test decides — with an observer that checks, every
few milliseconds, that no lease has two leaders and no term is granted twice."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from sidecar.app_check import AppCheck, AppCheckSettings
from sidecar.backends.memory import MemoryStoreClient
from sidecar.hold import hold, resume
from sidecar.lease_set import LeaseSet, TransferRefused
from sidecar.status import Role, Transition
from tests.unit.test_lease_set import TIMING, Cluster

LEASE = TIMING.lease_duration


@pytest.fixture(autouse=True)
def no_collector_pause() -> Iterator[None]:
    """These tests run a 1 s lease in real time inside the test run's own process, whose heap
    holds by then what every earlier test left: in CI one full collection walking it held the
    loop past half the lease, and the leader demoted on that renewal gap ("renewal gap past
    half the lease", then "stopped leading", on an in-memory store). The sidecar freezes its
    start-up heap for the same reason (`Sidecar.start`); here: collect once, freeze the rest,
    so that a collection during the test walks only what the test made."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
async def cluster_of() -> AsyncIterator[Callable[[int], Cluster]]:
    made: list[Cluster] = []

    def make(leases: int) -> Cluster:
        made.append(Cluster(leases, TIMING))
        return made[-1]

    yield make
    for cluster in made:
        await cluster.close()


class ControlledApp(AppCheck):
    """An app check whose verdict the test sets (`become`); it checks nothing itself."""

    def __init__(self, up: bool) -> None:
        super().__init__(AppCheckSettings(heartbeat=60.0, period=0.05))
        self.up = up

    async def run(self) -> None:
        await asyncio.Event().wait()


class Replica:
    def __init__(self, lease_set: LeaseSet, app: ControlledApp, moves: Counter[str]) -> None:
        self.set = lease_set
        self.app = app
        self.moves = moves  # hand-overs counted by reason
        self.reasons: list[str] = []  # every demotion's reason
        lease_set.primary.on_transition(self._note)

    def _note(self, transition: Transition) -> None:
        if transition.role is Role.FOLLOWER:
            self.reasons.append(transition.reason)

    @property
    def leads(self) -> bool:
        return self.set.primary.is_leader()


async def start(cluster: Cluster, name: str, *, app_up: bool) -> Replica:
    app = ControlledApp(app_up)
    moves: Counter[str] = Counter()
    lease_set = await cluster.start(
        name, app=app, count_handover=lambda reason: moves.update([reason])
    )
    return Replica(lease_set, app, moves)


def leaders(cluster: Cluster) -> list[str]:
    return [name for name, s in cluster.sets.items() if s.primary.is_leader()]


async def stays(cluster: Cluster, condition, seconds: float, what: str) -> None:
    """``condition`` holds at every look for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), f"{what}: {leaders(cluster)}"
        await asyncio.sleep(0.01)


async def test_a_replica_whose_app_is_down_never_leads(cluster_of) -> None:
    """At start-up too: a replica alone with its app down leaves the lease free for leases;
    one whose app is up leads as soon as it starts, and the first keeps out once its app is
    up (nothing to take: the lease is held)."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=False)
    await stays(cluster, lambda: not a.leads, 3 * LEASE, "a leads for an app that is down")
    b = await start(cluster, "b", app_up=True)
    await cluster.until(lambda: b.leads, LEASE, "b leads")
    a.app.become(True)
    await stays(cluster, lambda: b.leads and not a.leads, 2 * LEASE, "b keeps the lease")
    assert cluster.violations == []


async def test_a_replica_whose_app_comes_up_takes_the_free_lease_at_once(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=False)
    await asyncio.sleep(LEASE / 2)
    a.app.become(True)
    waited = await cluster.until(lambda: a.leads, LEASE, "a leads once its app is up")
    assert waited < TIMING.renew_interval


async def test_a_leader_whose_app_goes_down_hands_the_lease_only_to_a_replica_whose_app_is_up(
    cluster_of,
) -> None:
    """One write, at once: the replica whose app is down is skipped (though it started last,
    which a hand-over would otherwise prefer), the term grows, and the move is counted as
    app_down."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    c = await start(cluster, "c", app_up=True)
    await asyncio.sleep(0.01)  # b starts last: the newest is preferred among equals
    b = await start(cluster, "b", app_up=False)
    await cluster.until(
        lambda: {x["identity"] for x in a.set.candidates() if x["live"]} == {"a_0000", "c_0000"},
        3 * LEASE,
        "a sees c live and b not",
    )
    term = a.set.primary.status().term
    a.app.become(False)
    waited = await cluster.until(lambda: c.leads, LEASE, "c leads")
    assert waited < TIMING.renew_interval  # a hand-over, not an expiry
    assert not a.leads
    assert not b.leads
    assert c.set.primary.status().term > term
    assert a.reasons == ["app_down"]
    assert a.moves == Counter({"app_down": 1})
    await stays(cluster, lambda: not b.leads, LEASE, "b led")
    assert cluster.violations == []


async def test_with_no_other_app_up_the_leader_keeps_the_lease_until_one_is(cluster_of) -> None:
    """Never worse than leading for a dead app: nobody could do the work. It says so, and
    hands over as soon as another app is up."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    b = await start(cluster, "b", app_up=False)
    await asyncio.sleep(2 * TIMING.renew_interval)  # b's beats are seen
    a.app.become(False)
    await stays(cluster, lambda: a.leads, 3 * LEASE, "a stopped leading with nobody to take over")
    assert a.set.app_down_alone_seconds > 2 * LEASE
    b.app.become(True)
    waited = await cluster.until(lambda: b.leads, 2 * LEASE, "b leads once its app is up")
    assert waited < 3 * TIMING.renew_interval
    assert a.reasons == ["app_down"]
    assert cluster.violations == []


async def test_a_leader_whose_app_goes_down_on_a_store_not_followed_still_hands_over(
    cluster_of,
) -> None:
    """Where the candidates are not streamed (SQLite), the leader reads them every app check
    period while it leads for a dead app, so another app coming up is seen within a period."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    app_b = ControlledApp(False)
    b_set = await cluster.start("b", app=app_b, follows=False)
    a.set.beat.registry.following = lambda: False  # type: ignore[method-assign,union-attr]
    await asyncio.sleep(2 * TIMING.renew_interval)
    a.app.become(False)
    await asyncio.sleep(LEASE)
    assert a.leads, a.reasons
    app_b.become(True)
    await cluster.until(lambda: b_set.primary.is_leader(), 2 * LEASE, "b leads")
    assert cluster.violations == []


async def test_a_drain_answers_503_at_once_and_keeps_the_lease_until_the_app_stops(
    cluster_of,
) -> None:
    """SIGTERM with an app check: /leader says 503 at once, the lease is renewed meanwhile (so
    nobody else starts beside the old app), and it moves once the app has stopped."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    b = await start(cluster, "b", app_up=True)
    await asyncio.sleep(2 * TIMING.renew_interval)
    draining = asyncio.create_task(a.set.drain(10 * LEASE))
    await asyncio.sleep(0.02)
    assert not a.set.primary.status().leader  # what /leader answers
    assert a.leads  # still held, and renewed
    await stays(cluster, lambda: a.leads and not b.leads, 2 * LEASE, "the lease moved early")
    a.app.become(False)
    assert await asyncio.wait_for(draining, 1.0) == "app_stopped"
    assert a.set.held() == [a.set.primary.lease]  # the drain's end leaves it to the shutdown
    await cluster.stop("a")
    await cluster.until(lambda: b.leads, LEASE / 2, "b leads after the shutdown hand-over")
    assert cluster.violations == []


async def test_a_drain_is_bounded_by_its_timeout(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    started = time.monotonic()
    assert await asyncio.wait_for(a.set.drain(0.3), 2.0) == "timeout"
    assert 0.3 <= time.monotonic() - started < 0.6


async def test_a_drain_ends_when_the_app_releases_the_lease_itself(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    draining = asyncio.create_task(a.set.drain(10 * LEASE))
    await asyncio.sleep(0.02)
    await a.set.release(None)  # POST /leader/release
    assert await asyncio.wait_for(draining, 1.0) == "released"


async def test_without_an_app_check_there_is_nothing_to_drain(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await cluster.start("a")
    await cluster.until(lambda: a.primary.is_leader(), LEASE, "a leads")
    assert await a.drain(10.0) == "none"
    assert a.primary.status().leader


async def test_a_hold_stops_the_leader_at_once_and_nobody_leads_until_resume(
    cluster_of,
) -> None:
    """The leader demotes as soon as it sees the hold (reason hold, counted); nobody takes
    the lease while it lasts; after resume a replica leads under a term above the hold's."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    b = await start(cluster, "b", app_up=True)
    term = a.set.primary.status().term
    operator = MemoryStoreClient(cluster.server).lease(cluster.names[0])
    held = await hold(operator, "ops", "migration", 3600.0, 1.0)
    assert held.term > term
    waited = await cluster.until(lambda: not a.leads, TIMING.retry_period, "a stops")
    assert waited < TIMING.retry_period
    assert a.reasons == ["hold"]
    assert a.moves == Counter({"hold": 1})
    await stays(cluster, lambda: leaders(cluster) == [], 3 * LEASE, "someone led on hold")
    shown = a.set.primary.hold_shown()
    assert shown is not None
    assert shown[1] == 3600.0
    await resume(operator, 1.0)
    await cluster.until(lambda: leaders(cluster) != [], LEASE, "a replica leads after resume")
    leader = a if a.leads else b
    assert leader.set.primary.status().term > held.term
    assert cluster.violations == []


@pytest.mark.parametrize("app_up", [True, False])
async def test_the_candidate_record_says_whether_the_app_is_up(cluster_of, app_up: bool) -> None:
    """An app that is down marks the record leaving too, so replicas of any version skip it."""
    cluster = cluster_of(1)
    await start(cluster, "a", app_up=app_up)
    other = await start(cluster, "b", app_up=True)
    await asyncio.sleep(2 * TIMING.renew_interval)
    assert other.set.beat is not None
    seen = {c.identity: c for c in await other.set.beat.registry.list()}
    assert seen["a_0000"].app == ("up" if app_up else "down")
    assert seen["a_0000"].leaving is (not app_up)


async def test_a_transfer_to_a_replica_whose_app_is_down_is_refused_saying_so(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    await start(cluster, "b", app_up=False)
    await asyncio.sleep(2 * TIMING.renew_interval)
    with pytest.raises(TransferRefused, match="b has its app down"):
        await a.set.transfer(None, "b")
    assert a.leads


async def test_a_leader_that_has_seen_the_only_other_replica_once_still_hands_over_to_it(
    cluster_of,
) -> None:
    """A leader that has just started (or reads a group no stream keeps current, as on
    SQLite) may have seen the other replica's record once: not yet live. With its own app
    down, keeping the lease leaves the job undone for sure; the replica whose record says its
    app is up takes it at once."""
    cluster = cluster_of(1)
    a = await start(cluster, "a", app_up=True)
    await cluster.until(lambda: a.leads, LEASE, "a leads")
    b = await start(cluster, "b", app_up=True)
    assert a.set.beat is not None
    registry = a.set.beat.registry
    registry.following = lambda: False  # type: ignore[method-assign]
    # What a leader that has read the group once knows: b's record as it is now, seen once.
    a.set.beat.view._seen.pop("b_0000", None)
    a.set.beat.view.observe(await registry.list(), cluster.sets["a"]._clock.now())
    assert [c.identity for c in a.set.beat.view.pending(a.set._clock.now())] == ["b_0000"]
    a.app.become(False)
    waited = await cluster.until(lambda: b.leads, LEASE, "b leads")
    assert waited < 0.25  # not after b's next beats were seen
    assert cluster.violations == []
