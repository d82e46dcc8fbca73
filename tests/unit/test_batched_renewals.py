"""Renewals in one request (issue 24), on the in-memory store and a hand-moved clock: each
lease's outcome of a batch is applied to that lease exactly as its own renewal's would be —
rule 1 per lease, rule 3's deadline per lease counted from when the batch was sent."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from sidecar.backends.base import (
    LeaseRecord,
    NotOwned,
    Renewal,
    RenewalOutcome,
    StoreUnavailable,
)
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.probe import StoreProbe
from sidecar.renewal import Batching
from sidecar.schedule import Scheduler
from sidecar.status import Role, Transition
from sidecar.timing import Timing
from tests.support.clock import FakeClock

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)
# One request timeout + 1 % of the lease (rule 3), written out rather than read from the code.
MARGIN = 1.0 + 0.01 * 10.0


class Client(MemoryStoreClient):
    """The in-memory client, with a look into each batch: what it carried, a hook that runs
    before the store answers (a slow store: the clock moves), and outcomes replaced."""

    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.sent: list[list[str]] = []
        self.during: Callable[[], None] = lambda: None
        self.replace: dict[str, RenewalOutcome] = {}  # lease → its outcome, not renewed
        self.refuse: StoreUnavailable | None = None  # the whole batch fails

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        self.sent.append([r.name for r in renewals])
        self.during()
        if self.refuse is not None:
            raise self.refuse
        kept = [r for r in renewals if r.name not in self.replace]
        answers = iter(await super().renew_many(kept))
        return [self.replace.get(r.name) or next(answers) for r in renewals]


class Rig:
    """``count`` leases of one replica ("a"), each with its elector, on one scheduler that
    batches their renewals."""

    def __init__(self, count: int) -> None:
        self.clock = FakeClock()
        self.server = MemoryServer(self.clock)
        self.client = Client(self.server)
        self.registry = CollectorRegistry()
        self.names = [f"jobs-{i}" for i in range(count)]
        self.electors = [
            Elector(
                self.client.lease(name),
                TIMING,
                "a_0000",
                name,
                metrics=Metrics(self.registry, name, TIMING.lease_duration),
                clock=self.clock,
                rng=random.Random(7),
            )
            for name in self.names
        ]
        self.probe = StoreProbe(
            self.electors[0].store.read, TIMING.retry_period, TIMING.request_timeout,
            clock=self.clock,
        )  # fmt: skip
        for elector in self.electors:
            elector.use_probe(self.probe)
        self.batching = Batching(
            self.client,
            dict(zip(self.electors, self.names, strict=True)),
            self.electors[0].metrics.store_request,
        )
        self.scheduler = Scheduler(self.electors, clock=self.clock, batching=self.batching)

    def steal(self, name: str, holder: str = "x_9999") -> None:
        """Another writer takes the lease behind our back, with a newer term."""
        row = self.server.state(name).row
        assert row is not None
        row.holder, row.term = holder, row.term + 1
        row.version = self.server.state(name).next_version()

    def record(self, name: str) -> LeaseRecord:
        record = self.server.state(name).record()
        assert record is not None
        return record

    def demotions(self, elector: Elector, reason: str) -> float | None:
        return self.registry.get_sample_value(
            "leader_sidecar_demotions_total",
            {"lease": elector.lease, "lease_group": elector.lease, "reason": reason},
        )

    def renew_requests(self) -> float:
        """Renewal requests counted, over every label."""
        return sum(
            sample.value
            for family in self.registry.collect()
            if family.name == "leader_sidecar_store_requests"
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels.get("op") == "renew"
        )


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = Rig(3)
    for elector in rig.electors:
        await elector.step()
        assert elector.is_leader()
    yield rig
    await rig.probe.close()


async def test_a_batch_where_one_lease_was_taken_over_renews_the_others_and_demotes_that_one(
    rig: Rig,
) -> None:
    """One request for the three leases: the two still ours are renewed (new version, holder
    and term kept, deadline a lease from the send), the one another writer took is demoted
    as lost and shows its new holder; the request is counted once."""
    a0, a1, a2 = rig.electors
    before = {name: rig.record(name) for name in rig.names}
    rig.clock.advance(TIMING.renew_interval)
    rig.steal("jobs-2")
    await rig.batching.renew(rig.electors)
    assert rig.client.sent == [rig.names]
    assert rig.renew_requests() == 1
    for elector in (a0, a1):
        status = elector.status()
        assert status.leader
        assert status.term == before[elector.lease].term
        assert status.valid_for == pytest.approx(TIMING.lease_duration - MARGIN)
        assert rig.record(elector.lease).version != before[elector.lease].version
        assert rig.demotions(elector, "lost") == 0
    assert not a2.is_leader()
    assert a2.role is Role.FOLLOWER
    assert a2.status().holder == "x_9999"
    assert rig.demotions(a2, "lost") == 1


async def test_a_batch_answered_after_a_leases_deadline_does_not_extend_it(rig: Rig) -> None:
    """Deadlines count from when the batch was sent, not from its answer: a batch sent before
    the first lease's deadline and answered after it renews the second lease to a lease from
    the send, and extends nothing of the first, which stops leading and takes the lease back
    under a new term (rule 5: its own name, renewed late)."""
    a0, a1, a2 = rig.electors
    rig.clock.advance(TIMING.renew_interval)  # a1 and a2 renew; a0 does not, here
    await rig.batching.renew([a1, a2])
    sent = rig.clock.now() + TIMING.lease_duration - MARGIN - TIMING.renew_interval - 0.5
    rig.clock.advance(sent - rig.clock.now())  # 0.5 s before a0's deadline
    answered = sent + 1.0  # after a0's deadline, before a1's
    rig.client.during = lambda: rig.clock.advance(answered - rig.clock.now())
    term = a0.status().term
    await rig.batching.renew([a0, a1])
    assert rig.client.sent[-1] == ["jobs-0", "jobs-1"]
    assert not a0.is_leader()
    assert rig.demotions(a0, "deadline") == 1
    assert a1.status().valid_for == pytest.approx(sent + TIMING.lease_duration - MARGIN - answered)
    assert rig.record("jobs-0").holder == "a_0000"  # the store did renew it, too late
    await a0.step()
    assert a0.is_leader()
    assert a0.status().term > term


async def test_a_batch_sent_after_a_leases_deadline_leaves_that_lease_out(rig: Rig) -> None:
    """A loop that runs late (a stall) and forms a batch past a lease's deadline: that lease
    demotes first (the gap alerted) and is not in the request; the others are renewed."""
    a0, a1, a2 = rig.electors
    rig.clock.advance(TIMING.renew_interval)
    await rig.batching.renew([a1, a2])
    rig.clock.advance(TIMING.lease_duration - MARGIN - TIMING.renew_interval + 0.1)
    await rig.batching.renew(rig.electors)
    assert rig.client.sent[-1] == ["jobs-1", "jobs-2"]
    assert not a0.is_leader()
    assert rig.demotions(a0, "deadline") == 1
    assert (
        rig.registry.get_sample_value(
            "leader_sidecar_renewal_gap_over_half_lease_total",
            {"lease": "jobs-0", "lease_group": "jobs-0"},
        )
        == 1
    )
    assert a1.is_leader()
    assert a2.is_leader()


async def test_a_partial_failure_of_the_store_is_per_lease(rig: Rig) -> None:
    """One lease's entry fails (a value the store cannot decode): that lease keeps leading
    while its deadline is ahead and retries within a retry period, with its error shown; the
    others are renewed, and the store counts as answering (nobody waits for the probe). A
    lease the store says is not ours is demoted; the rest are untouched by it."""
    a0, a1, a2 = rig.electors
    rig.clock.advance(TIMING.renew_interval)
    versions = {name: rig.record(name).version for name in rig.names}
    rig.client.replace = {
        "jobs-0": StoreUnavailable("unexpected value in the key"),
        "jobs-2": NotOwned("not held by a_0000 with term 3", rig.record("jobs-2")),
    }
    await rig.batching.renew(rig.electors)
    assert a0.is_leader()
    assert a0.last_error == "unexpected value in the key"
    assert a0.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN - 3.0)
    assert 0 < a0.wake_at() - rig.clock.now() <= 1.5 * TIMING.retry_period
    assert rig.record("jobs-0").version == versions["jobs-0"]
    assert a1.is_leader()
    assert a1.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN)
    assert rig.record("jobs-1").version != versions["jobs-1"]
    assert not a2.is_leader()
    assert rig.demotions(a2, "lost") == 1
    assert not rig.probe.refusing


async def test_a_batch_nothing_is_known_of_fails_every_lease_alike(rig: Rig) -> None:
    """The whole request fails (no answer): every lease keeps leading while its deadline is
    ahead and retries, none renewed, and the store counts as refusing (the probe takes over
    for the followers)."""
    rig.clock.advance(TIMING.renew_interval)
    rig.client.refuse = StoreUnavailable("connection refused")
    await rig.batching.renew(rig.electors)
    for elector in rig.electors:
        assert elector.is_leader()
        assert elector.last_error == "connection refused"
        assert elector.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN - 3.0)
    assert rig.probe.refusing
    assert rig.renew_requests() == 1


class Stalling(MemoryStoreClient):
    """The in-memory client whose batches fail at once until ``hang_from`` (monotonic), and
    never answer from then on (each is cut by the scheduler's request timeout)."""

    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.hang_from = float("inf")
        self.sent: list[float] = []

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        now = time.monotonic()
        self.sent.append(now)
        if now < self.hang_from:
            raise StoreUnavailable("connection refused")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_lease_whose_deadline_passes_while_its_batch_is_out_demotes_at_the_deadline() -> (
    None
):
    """Rule 3 in the scheduler's loop: a batch sent before a lease's deadline and still out when
    it passes does not hold the demotion back until the batch times out. The demotion (its
    transition: the webhook, the signal, the Event) comes at the deadline, as a renewal of its
    own cut at the deadline does."""
    timing = Timing(lease_duration=3.0, renew_interval=1.0, retry_period=0.3, request_timeout=0.9)
    server = MemoryServer()
    client = Stalling(server)
    registry = CollectorRegistry()
    names = ["jobs-0", "jobs-1"]
    electors = [
        Elector(
            client.lease(name),
            timing,
            "a_0000",
            name,
            metrics=Metrics(registry, name, timing.lease_duration),
            rng=random.Random(7),
        )
        for name in names
    ]
    for elector in electors:
        await elector.step()
        assert elector.is_leader()
    deadline = time.monotonic() + min(e.status().valid_for for e in electors)
    # Fail at once until 0.6 s before the deadline (retried every 0.3-0.45 s), then stall: the
    # last retry goes out in [deadline - 0.6, deadline - 0.15] and would time out 0.9 s later,
    # at least 0.3 s past the deadline.
    client.hang_from = deadline - 0.6
    demoted: list[tuple[float, str]] = []
    all_demoted = asyncio.Event()

    def note(transition: Transition) -> None:
        if transition.role is Role.FOLLOWER:
            demoted.append((time.monotonic(), transition.reason))
            if len(demoted) == len(electors):
                all_demoted.set()

    for elector in electors:
        elector.on_transition(note)
    scheduler = Scheduler(
        electors,
        batching=Batching(
            client, dict(zip(electors, names, strict=True)), electors[0].metrics.store_request
        ),
    )
    task = asyncio.create_task(scheduler.run())
    try:
        async with asyncio.timeout(deadline - time.monotonic() + 2 * timing.request_timeout):
            await all_demoted.wait()
    finally:
        for elector in electors:
            elector.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert any(sent >= client.hang_from for sent in client.sent)  # a batch was out at the deadline
    assert [reason for _, reason in demoted] == ["deadline", "deadline"]
    for at, _ in demoted:
        assert at - deadline < 0.2


async def test_a_timer_that_a_tick_leaves_where_it_was_does_not_spin_the_loop(rig: Rig) -> None:
    """The scheduler's pass over the due moments ends even when a tick leaves an elector's
    next moment where it was: a leader exactly at its half-lease mark (a gap of exactly half
    the lease is not yet past it) and waiting for a Retry-After beyond it. A pass that kept
    re-reading that moment at the same ``now`` would spin forever, every lease of the sidecar
    with it. (The pass runs on a thread here, so that a spin fails the test instead of hanging
    it.)"""
    a0 = rig.electors[0]
    rig.clock.advance(TIMING.renew_interval)
    rig.client.refuse = StoreUnavailable("busy", retry_after=3.0)
    await rig.batching.renew([a0])
    assert a0.is_leader()
    half_mark = rig.clock.now() - TIMING.renew_interval + TIMING.lease_duration / 2
    assert a0.wake_at() == half_mark < a0.status().valid_for + rig.clock.now()
    rig.clock.advance(half_mark - rig.clock.now())
    rig.scheduler._push(a0, a0.wake_at())
    due: list[list[Elector]] = []
    worker = threading.Thread(
        target=lambda: due.append(rig.scheduler._pop_due(rig.clock.now())), daemon=True
    )
    worker.start()
    worker.join(timeout=5.0)
    assert not worker.is_alive()
    assert due == [[]]
    assert a0.is_leader()
