"""Many leases per sidecar on the in-memory store, in real (short) time: balance, a dead
replica's shards, transfer, and the rolling-update preference — each with an observer that
checks, every few milliseconds, that no lease has two leaders and no term is granted twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.app_check import AppCheck
from sidecar.backends.base import Candidate
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.lease_set import LeaseSet, TransferRefused, _rank
from sidecar.metrics import Metrics
from sidecar.timing import Timing

TIMING = Timing.build(1.0, 0.2, 0.2, 0.1)


def count_reads(lease_set: LeaseSet) -> Callable[[], int]:
    """From now on, count the reads of the candidate records ``lease_set`` makes."""
    assert lease_set.beat is not None
    read = lease_set.beat.registry.list
    reads = 0

    async def counted() -> list[Candidate]:
        nonlocal reads
        reads += 1
        return await read()

    lease_set.beat.registry.list = counted  # type: ignore[method-assign]
    return lambda: reads


def live_candidates(lease_set: LeaseSet) -> list[str]:
    return [c["identity"] for c in lease_set.candidates() if c["live"]]  # type: ignore[misc]


def how_it_led(caplog: pytest.LogCaptureFixture, identity: str) -> list[str]:
    """The ``how`` of each "became leader" line of ``identity`` (captured at INFO)."""
    return [
        r.sidecar_fields["how"]  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "became leader" and r.sidecar_fields["identity"] == identity  # type: ignore[attr-defined]
    ]


class Cluster:
    def __init__(self, leases: int, timing: Timing = TIMING) -> None:
        self.timing = timing
        self.server = MemoryServer()
        self.names = [f"jobs-{i}" for i in range(leases)]
        self.sets: dict[str, LeaseSet] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.violations: list[str] = []
        self.grants: dict[tuple[str, int], str] = {}  # (lease, term) -> identity
        self.changes = 0  # leader changes seen by the observer, over every lease
        self._leaders: dict[str, str | None] = {}
        self._observer: asyncio.Task[None] | None = None

    async def start(
        self,
        name: str,
        *,
        revision: str = "",
        priority: int = 0,
        follows: bool = True,
        app: AppCheck | None = None,
        count_handover: Callable[[str], None] = lambda reason: None,
    ) -> LeaseSet:
        """``follows=False``: a store that cannot follow the candidate group (SQLite).
        ``app``: leadership follows that app check (`LeaseSet.use_app`)."""
        registry = CollectorRegistry()
        lease_set = LeaseSet.open(
            MemoryStoreClient(self.server),
            [(n, n) for n in self.names],
            self.timing,
            f"{name}_0000",
            group="jobs",
            registry_metrics=lambda lease: Metrics(registry, lease, self.timing.lease_duration),
            revision=revision,
            priority=priority,
            stand_back=0.3,
        )
        if not follows:
            assert lease_set.beat is not None

            async def never() -> AsyncIterator[list[Candidate] | None]:
                return
                yield

            lease_set.beat.registry.changes = never  # type: ignore[method-assign]
            lease_set.beat.registry.following = lambda: False  # type: ignore[method-assign]
        if app is not None:
            lease_set.use_app(app, count_handover)
        await lease_set.prime(0.1)
        self.sets[name] = lease_set
        self.tasks[name] = asyncio.create_task(lease_set.run())
        if self._observer is None:
            self._observer = asyncio.create_task(self._observe())
        return lease_set

    async def crash(self, name: str) -> None:
        """Stop every loop without releasing anything: a SIGKILL."""
        lease_set = self.sets.pop(name)
        lease_set.stop()
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self._crashed = [*getattr(self, "_crashed", []), lease_set]

    async def stop(self, name: str) -> None:
        """SIGTERM, in the order the sidecar does it: stop the electors, hand over, then
        end the loops (the candidates' change stream still runs during the hand-over)."""
        lease_set = self.sets[name]
        lease_set.stop()
        await lease_set.shutdown("shutdown", 0.5)
        await asyncio.gather(self.tasks[name], return_exceptions=True)
        del self.sets[name], self.tasks[name]

    def observed_up_to_date(self) -> bool:
        """The observer has seen each lease's current leader (it samples every few ms, so a
        hand-over just made may not be counted yet)."""
        for lease in self.names:
            leaders = [s.identity for s in self.sets.values() if s.get(lease).is_leader()]
            if leaders and self._leaders.get(lease) != leaders[0]:
                return False
        return True

    def held(self) -> dict[str, int]:
        return {name: len(s.held()) for name, s in self.sets.items()}

    async def _observe(self) -> None:
        every = [*self.sets.values()]
        while True:
            every = list(
                {
                    id(s): s for s in [*every, *self.sets.values(), *getattr(self, "_crashed", [])]
                }.values()
            )
            for lease in self.names:
                leaders = [s for s in every if (e := s.get(lease)) and e.is_leader()]
                if len(leaders) > 1:
                    self.violations.append(f"{lease}: {[s.identity for s in leaders]}")
                for s in leaders:
                    term = s.get(lease).status().term  # type: ignore[union-attr]
                    first = self.grants.setdefault((lease, term), s.identity)
                    if first != s.identity:
                        self.violations.append(f"{lease} term {term}: {first} and {s.identity}")
                leader = leaders[0].identity if leaders else None
                if leader is not None and self._leaders.get(lease) not in (None, leader):
                    self.changes += 1
                if leader is not None:
                    self._leaders[lease] = leader
            await asyncio.sleep(0.003)

    async def until(self, condition, timeout: float, what: str) -> float:
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{what} not within {timeout}s: {self.held()}")
            await asyncio.sleep(0.01)
        return time.monotonic() - started

    async def close(self) -> None:
        for name in list(self.sets):
            await self.crash(name)
        if self._observer is not None:
            self._observer.cancel()
            await asyncio.gather(self._observer, return_exceptions=True)


@pytest.fixture
async def cluster_of() -> AsyncIterator:
    made: list[Cluster] = []

    def make(leases: int, timing: Timing = TIMING) -> Cluster:
        made.append(Cluster(leases, timing))
        return made[-1]

    yield make
    for cluster in made:
        await cluster.close()


async def test_twelve_leases_spread_over_three_replicas_and_then_stay_put(cluster_of) -> None:
    cluster = cluster_of(12)
    await cluster.start("a")
    await cluster.until(lambda: cluster.held() == {"a": 12}, 3, "a alone holds all")
    await cluster.start("b")
    await cluster.start("c")
    waited = await cluster.until(
        lambda: sorted(cluster.held().values()) == [4, 4, 4], 4, "each replica holds 4"
    )
    assert waited < 10 * TIMING.renew_interval
    await cluster.until(cluster.observed_up_to_date, 1, "the observer caught up")
    changes = cluster.changes
    await asyncio.sleep(6 * TIMING.renew_interval)  # nothing changed: nothing moves
    assert cluster.changes == changes
    assert sorted(cluster.held().values()) == [4, 4, 4]
    assert cluster.violations == []


def lost_races(lease_set: LeaseSet) -> float:
    """Acquires this replica sent and the store refused: someone else got there first."""
    registry = lease_set.primary.metrics.registry
    return sum(
        registry.get_sample_value(
            "leader_sidecar_store_requests_total",
            {"lease": name, "lease_group": name, "op": "acquire", "outcome": outcome},
        )
        or 0.0
        for name in lease_set.electors
        for outcome in ("held", "conflict")
    )


async def test_replicas_starting_together_split_free_leases_without_racing(cluster_of) -> None:
    """Each free lease is tried first by one replica (rendezvous hashing): no lost races (each
    is a write that queues renewals behind it). A replica seen with one beat counts in no
    share (issue 25), so each takes the leases it ranks first for; once each has seen the
    other beat, the balancer moves exactly the surplus of that split, and it is even."""
    cluster = cluster_of(16)

    def replica(name: str) -> LeaseSet:
        registry = CollectorRegistry()
        return LeaseSet.open(
            MemoryStoreClient(cluster.server),
            [(n, n) for n in cluster.names],
            TIMING,
            f"{name}_0000",
            group="jobs",
            registry_metrics=lambda lease: Metrics(registry, lease, TIMING.lease_duration),
            stand_back=0.3,
        )

    sets = [replica("a"), replica("b")]
    for lease_set in [*sets, sets[0]]:  # a primes again: both know both
        await lease_set.prime(0.1)
    tasks = [asyncio.create_task(s.run()) for s in sets]
    try:
        deadline = time.monotonic() + 3
        while sorted(len(s.held()) for s in sets) != [8, 8]:
            assert time.monotonic() < deadline, [len(s.held()) for s in sets]
            await asyncio.sleep(0.01)
        assert [lost_races(s) for s in sets] == [0.0, 0.0]
        handed = [
            s.primary.metrics.registry.get_sample_value(
                "leader_sidecar_demotions_total",
                {"lease": n, "lease_group": n, "reason": "released"},
            )
            for s in sets
            for n in s.electors
        ]
        ranks_first = Counter(
            max(("a_0000", "b_0000"), key=lambda identity, n=n: _rank(n, identity))
            for n in cluster.names
        )
        assert sum(h or 0.0 for h in handed) == abs(ranks_first["a_0000"] - 8)
    finally:
        for lease_set in sets:
            lease_set.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_new_replica_takes_its_share_and_never_more(cluster_of) -> None:
    cluster = cluster_of(16)
    for name in "abcd":
        await cluster.start(name)
    await cluster.until(lambda: sorted(cluster.held().values()) == [4] * 4, 4, "4 each")
    await cluster.start("e")
    await cluster.until(
        lambda: sorted(cluster.held().values()) == [3, 3, 3, 3, 4], 4, "the new one has 3"
    )
    assert max(cluster.held().values()) <= 4
    assert cluster.violations == []


async def test_a_replica_never_takes_more_than_its_share(cluster_of) -> None:
    """Another live candidate (here one that takes nothing) halves the share: the first
    replica takes 4 of 8 leases and leaves the rest free, rather than taking all and handing
    half back later."""
    cluster = cluster_of(8)
    other = MemoryStoreClient(cluster.server).candidates("jobs")

    async def beat_forever() -> None:
        while True:
            await other.beat(Candidate("idle_0000", ""), TIMING.lease_duration)
            await asyncio.sleep(TIMING.renew_interval)

    beating = asyncio.create_task(beat_forever())
    try:
        a = await cluster.start("a")
        await cluster.until(lambda: cluster.held() == {"a": 4}, 3, "a holds its share")
        most = 4
        for _ in range(int(4 * TIMING.lease_duration / 0.01)):
            most = max(most, len(a.held()))
            await asyncio.sleep(0.01)
        assert most == 4
    finally:
        beating.cancel()
    assert cluster.violations == []


async def test_a_dead_replicas_leases_are_taken_within_about_a_lease(cluster_of) -> None:
    cluster = cluster_of(9)
    for name in "abc":
        await cluster.start(name)
    await cluster.until(lambda: sorted(cluster.held().values()) == [3, 3, 3], 4, "3 each")
    await cluster.crash("c")
    waited = await cluster.until(
        lambda: sorted(cluster.held().values()) in ([4, 5], [5, 4]), 4, "c's leases taken"
    )
    assert waited < 2 * TIMING.lease_duration + 4 * TIMING.renew_interval
    assert cluster.violations == []


async def test_transfer_hands_the_lease_to_the_named_replica(cluster_of) -> None:
    cluster = cluster_of(1)
    a = await cluster.start("a")
    await cluster.until(lambda: cluster.held() == {"a": 1}, 3, "a leads")
    await cluster.start("b")
    c = await cluster.start("c")
    # Only a candidate seen beating is a successor: a waits for b's and c's next beats.
    await cluster.until(lambda: len(live_candidates(a)) == 3, 2, "a sees three beating")
    term = a.primary.status().term
    for _ in range(3):  # b never wins the race: the others stand back for the successor
        leader = next(s for s in cluster.sets.values() if s.held())
        target = "c" if leader is not c else "a"
        # A leader of one lease reads the group from its grant on: it names the target once
        # it has seen it beat.
        await cluster.until(
            lambda t=target, s=leader: f"{t}_0000" in live_candidates(s), 2, f"{target} beats"
        )
        handed, successor = await leader.transfer(None, target)  # a pod name works too
        assert handed == ["jobs-0"]
        assert successor == f"{target}_0000"
        await cluster.until(lambda t=target: cluster.held()[t] == 1, 1, f"{target} leads")
        assert cluster.held()["b"] == 0
    assert cluster.sets[target].primary.status().term > term
    with pytest.raises(TransferRefused, match="not a live candidate"):
        await cluster.sets[target].transfer(None, "nobody")
    assert cluster.violations == []


@pytest.mark.parametrize("follows", [True, False], ids=["store-follows-group", "cannot-follow"])
async def test_shutdown_hands_the_lease_to_the_other_revision(
    cluster_of, caplog: pytest.LogCaptureFixture, follows: bool
) -> None:
    """A rolling update: the old leader's successor is a replica of the new revision, seen
    beating, whose latest beat came after the leader's last periodic read of the candidates.
    A store that follows the group told the leader of the change (here: another replica
    joining), and the hand-over reads nothing first (one round trip less); a store that
    cannot (SQLite) is read once at shutdown."""
    cluster = cluster_of(1)
    old_a = await cluster.start("old-a", revision="v1", follows=follows)
    await cluster.until(lambda: cluster.held() == {"old-a": 1}, 3, "old-a leads")
    assert old_a.beat is not None
    new_a = await cluster.start("new-a", revision="v2")
    # Only a candidate seen beating is handed a lease: old-a reads the group (every half
    # lease) until it has seen new-a's record change, then reads no more on its own.
    await cluster.until(lambda: "new-a_0000" in live_candidates(old_a), 3, "new-a beats")
    # An old replica that (re)started after the new one, seen beating too: the newest start
    # would be the answer without the revision preference.
    old_b = await cluster.start("old-b", revision="v1")
    await cluster.until(lambda: "old-b_0000" in live_candidates(old_a), 3, "old-b beats")
    old_a.beat.interval = 3600.0
    await asyncio.sleep(0.05)
    assert new_a.beat is not None
    assert old_b.beat is not None
    await new_a.beat.once()  # beats after old-a's last periodic read
    await old_b.beat.once()
    await asyncio.sleep(0.01)
    assert old_a.beat.current() is follows
    reads = count_reads(old_a)
    caplog.set_level("INFO", logger="sidecar.leases")
    caplog.set_level("INFO", logger="sidecar.elector")
    await cluster.stop("old-a")
    named = [
        r.sidecar_fields["to"]  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "handing the leases over on shutdown"
    ]
    assert named == [["new-a_0000"]]
    assert reads() == (0 if follows else 1)
    await cluster.until(lambda: cluster.held().get("new-a") == 1, 1, "new-a leads")
    assert cluster.held()["old-b"] == 0
    assert cluster.violations == []
    # One write: the hand-over granted new-a, which led on it without a write of its own.
    assert how_it_led(caplog, "new-a_0000") == ["handed"]


async def test_a_hand_over_reads_first_when_the_versions_it_would_name_are_too_old(
    cluster_of, caplog: pytest.LogCaptureFixture
) -> None:
    """A store whose stream tells joins and leaves but not beats (Redis; memory here): the
    leader knows the successor's version from its last read. Named by a beat older than
    `Timing.handed_reach`, the grant cannot be led on, and the successor wrote one of its own
    (a round trip and a term more: one Redis hand-off in four at a 1 s lease). The leader now
    reads first when its read is that old, and the successor leads on the grant it was
    handed."""
    cluster = cluster_of(1)
    a = await cluster.start("a")
    await cluster.until(lambda: cluster.held() == {"a": 1}, 3, "a leads")
    await cluster.start("b")
    assert a.beat is not None
    a.beat.interval = 3600.0  # a reads the group no more on its own
    await asyncio.sleep(0.5 + TIMING.handed_reach + 0.2)  # a's last read is older than that
    assert a.beat.current()  # the stream has reported nothing a read since has not shown
    assert not a.beat.versions_fresh()
    reads = count_reads(a)
    term = a.primary.status().term
    caplog.set_level("INFO", logger="sidecar.elector")
    await cluster.stop("a")
    await cluster.until(lambda: cluster.held().get("b") == 1, 1, "b leads")
    assert reads() == 1
    assert how_it_led(caplog, "b_0000") == ["handed"]
    assert cluster.sets["b"].primary.status().term == term + 1
    assert cluster.violations == []


async def test_a_successor_whose_beat_comes_late_still_leads_on_the_hand_over(
    cluster_of, caplog: pytest.LogCaptureFixture
) -> None:
    """One lease at the default timing of a 1 s lease (renew every third, requests 1/6 s).
    The leader names the successor's version from its last read (the memory store, like
    Redis, streams no beats), that read as old as the leader lets it be before reading again,
    made just before the successor's next beat, which came 0.1 s late (a loaded machine).
    With a beat every half lease and reads trusted until the reach less a beat, that version
    was past the 0.66 s reach by the time the hand-over arrived, and the successor had to
    write a grant of its own, a term more. Now it leads on the hand-over: the next term."""
    late = 0.1
    timing = Timing.build(1.0)
    cluster = cluster_of(1, timing)
    a = await cluster.start("a")
    await cluster.until(lambda: cluster.held() == {"a": 1}, 3, "a leads")
    b = await cluster.start("b")
    await cluster.until(lambda: len(a.candidates()) == 2, 2, "a sees b")
    assert a.beat is not None
    assert b.beat is not None
    a.beat.interval = 3600.0  # a reads the group only when the test says (or before handing)
    every = b.beat.interval
    write = b.beat.registry.beat
    landed = asyncio.Event()

    async def late_after_this_one(candidate: Candidate, duration: float) -> None:
        await write(candidate, duration)
        if not landed.is_set():
            assert b.beat is not None
            b.beat.interval = every + late  # the wait for the next beat starts after this
            landed.set()

    loop = asyncio.get_running_loop()
    b.beat.registry.beat = late_after_this_one  # type: ignore[method-assign]
    await asyncio.wait_for(landed.wait(), 2)
    sent = loop.time()
    await asyncio.sleep(every + late - 0.02)  # just before the late beat
    b.beat.interval = every
    await a.beat.refresh(timing.request_timeout)
    await asyncio.sleep(max(0.0, a.beat.versions_fresh_for - 0.02))
    assert a.beat.versions_fresh()  # so the hand-over names the version of that read
    term = a.primary.status().term
    caplog.set_level("INFO", logger="sidecar.elector")
    await cluster.stop("a")
    age = loop.time() - sent
    await cluster.until(lambda: cluster.held().get("b") == 1, 1, "b leads")
    assert how_it_led(caplog, "b_0000") == ["handed"], f"named a beat {age:.3f}s old"
    assert b.primary.status().term == term + 1
    assert cluster.violations == []


async def test_a_replica_that_leaves_gives_back_a_lease_handed_to_it_too_late(
    cluster_of,
) -> None:
    """Scaled down together: the leader hands the lease to a replica that is shutting down,
    having decided before it heard the replica leave. The replica looks once more before it
    exits and releases the grant, so the third replica takes the lease at once rather than
    waiting out a lease nobody holds."""
    cluster = cluster_of(1)
    a = await cluster.start("a")
    await cluster.until(lambda: cluster.held() == {"a": 1}, 3, "a leads")
    b = await cluster.start("b")
    await cluster.start("c")
    await cluster.until(lambda: len(a.candidates()) == 3, 2, "a sees three candidates")
    assert a.beat is not None
    chosen_by = a.beat.view.version_of("b_0000")
    assert chosen_by is not None
    b.stop()
    leaving = asyncio.create_task(b.shutdown("shutdown", 0.5))
    await asyncio.sleep(0.01)  # b's record is gone; b is still looking out
    assert not leaving.done()
    assert await a.primary.release("released", successor="b_0000", handed=chosen_by)
    await leaving
    await asyncio.gather(cluster.tasks.pop("b"), return_exceptions=True)
    del cluster.sets["b"]
    record = cluster.server.state("jobs-0").record()
    assert record is not None
    assert record.holder != "b_0000"
    waited = await cluster.until(lambda: cluster.held().get("c") == 1, 0.5, "c leads")
    assert waited < TIMING.lease_duration / 2
    assert cluster.violations == []


async def test_with_several_leases_a_replica_that_leaves_gives_back_one_handed_too_late(
    cluster_of,
) -> None:
    """The same with four shards: b hands its own shards over on shutdown, and then a, which
    decided before it heard b leave, hands b one of its shards. b looks once more (50 ms
    later) and gives it back: the shard is free for anyone at once (released), not held in
    the name of a replica that is gone, which the others would wait out for a lease."""
    cluster = cluster_of(4)
    a = await cluster.start("a")
    b = await cluster.start("b")
    await cluster.start("c")
    await cluster.until(
        lambda: sorted(cluster.held().values()) in ([1, 1, 2], [0, 2, 2]), 4, "spread"
    )
    await cluster.until(lambda: len(a.candidates()) == 3 and a.held(), 2, "a sees three, holds one")
    assert a.beat is not None
    chosen_by = a.beat.view.version_of("b_0000")
    assert chosen_by is not None
    lease = a.held()[0]
    b.stop()
    leaving = asyncio.create_task(b.shutdown("shutdown", 0.5))
    await cluster.until(lambda: not b.held(), 0.3, "b handed its own shards over")
    await asyncio.sleep(0.01)
    assert not leaving.done(), "b did not look out for a late hand-over"
    assert await a.get(lease).release("released", successor="b_0000", handed=chosen_by)
    await leaving
    await asyncio.gather(cluster.tasks.pop("b"), return_exceptions=True)
    del cluster.sets["b"]
    record = cluster.server.state(lease).record()
    assert record is not None
    assert (record.holder, record.released) == (None, True)
    await cluster.until(
        lambda: any(s.get(lease).is_leader() for s in cluster.sets.values()), 3, "taken"
    )
    assert cluster.violations == []


async def test_a_rolling_update_moves_each_shard_once(cluster_of) -> None:
    """Two old replicas (v1) hold 4 shards each; two new ones (v2) join, then the old ones
    stop one by one (a Deployment's rolling update). The new replicas get nothing while
    they join (the mix of revisions is changing: a rollout), and each old replica hands
    its shards to new ones as it leaves: 8 shards, 8 leader changes."""
    cluster = cluster_of(8)
    await cluster.start("old-a", revision="v1")
    await cluster.start("old-b", revision="v1")
    await cluster.until(lambda: sorted(cluster.held().values()) == [4, 4], 4, "4 each")
    await cluster.until(cluster.observed_up_to_date, 1, "the observer caught up")
    changes = cluster.changes
    await cluster.start("new-a", revision="v2")
    await cluster.start("new-b", revision="v2")
    await asyncio.sleep(8 * TIMING.renew_interval)  # a balancer would have moved shards by now
    assert cluster.held()["new-a"] == cluster.held()["new-b"] == 0
    assert cluster.changes == changes
    for old in ("old-a", "old-b"):
        await asyncio.sleep(2 * TIMING.renew_interval)  # the others see it before it leaves
        await cluster.stop(old)
    await cluster.until(
        lambda: sorted(cluster.held().values()) == [4, 4], 4, "the new replicas hold all"
    )
    await cluster.until(cluster.observed_up_to_date, 1, "the observer caught up")
    assert cluster.changes - changes == 8
    assert cluster.violations == []
