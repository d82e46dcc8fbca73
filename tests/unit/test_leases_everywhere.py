"""Issue 32: every listener's ``GET /leases`` says the same about the candidates as the
leader's — read from the store's records, not from what the local task happened to keep (a
follower of one lease never reads the group, and answered ``"candidates": []``) — at the cost
of one store read a beat however often it is asked; and a replica that has just started is
a transfer target within one beat, or the ``409`` says when to retry (``Retry-After``).
Real aiohttp servers, two replicas on the in-memory store, the default timing."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.api import create_local_app, create_public_app
from sidecar.backends.base import Candidate, StoreUnavailable
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.clock import SYSTEM_CLOCK
from sidecar.lease_set import LeaseSet
from sidecar.metrics import Metrics
from sidecar.timing import Timing
from tests.unit.test_api import client_for
from tests.unit.test_lease_set import count_reads

TIMING = Timing.build(15.0)


def replica(server: MemoryServer, name: str) -> LeaseSet:
    registry = CollectorRegistry()
    return LeaseSet.open(
        MemoryStoreClient(server),
        [("default", "default")],
        TIMING,
        f"{name}_0000",
        group="default",
        registry_metrics=lambda lease: Metrics(registry, lease, TIMING.lease_duration),
        stand_back=TIMING.request_timeout,
    )


async def until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.01)


class Replicas:
    def __init__(self) -> None:
        self.server = MemoryServer()
        self.tasks: list[asyncio.Task[None]] = []
        self.sets: list[LeaseSet] = []

    async def start(self, name: str, *, run: bool = True) -> LeaseSet:
        lease_set = replica(self.server, name)
        await lease_set.prime(1.0)
        self.sets.append(lease_set)
        if run:
            self.run(lease_set)
        return lease_set

    def run(self, lease_set: LeaseSet) -> None:
        self.tasks.append(asyncio.create_task(lease_set.run()))

    async def close(self) -> None:
        for lease_set in self.sets:
            lease_set.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    cluster = Replicas()
    yield cluster
    await cluster.close()


def pending(lease_set: LeaseSet) -> list[str]:
    assert lease_set.beat is not None
    return [c.identity for c in lease_set.beat.view.pending(SYSTEM_CLOCK.now())]


async def test_a_followers_leases_lists_the_candidates_as_the_leaders_does(
    replicas: Replicas,
) -> None:
    a = await replicas.start("a")
    await until(lambda: a.held() == ["default"], 2, "a leads")
    b = await replicas.start("b")
    await until(lambda: b.primary.status().holder == "a_0000", 2, "b sees a lead")
    answers = {}
    for name, lease_set in (("leader", a), ("follower", b)):
        public = create_public_app(lease_set, CollectorRegistry(), dict)
        async with await client_for(public) as client:
            answer = await client.get("/leases")
            assert answer.status == 200
            answers[name] = (await answer.json())["candidates"]
    assert [c["identity"] for c in answers["follower"]] == ["a_0000", "b_0000"]
    assert answers["follower"] == answers["leader"]
    assert [c["live"] for c in answers["follower"]] == [True, True]


async def test_a_flood_of_leases_requests_reads_the_store_once_a_beat(
    replicas: Replicas,
) -> None:
    a = await replicas.start("a")
    await until(lambda: a.held() == ["default"], 2, "a leads")
    b = await replicas.start("b")
    reads = count_reads(b)
    async with await client_for(create_local_app(b)) as client:
        answers = await asyncio.gather(*(client.get("/leases") for _ in range(50)))
        assert [answer.status for answer in answers] == [200] * 50
        bodies = [await answer.json() for answer in answers]
    assert reads() == 1
    assert all(len(body["candidates"]) == 2 for body in bodies)


async def test_a_flood_while_the_store_does_not_answer_still_reads_once_a_beat(
    replicas: Replicas,
) -> None:
    """A read that fails counts as the beat's read: the requests behind it do not each try
    again (serially, each up to a request timeout)."""
    a = await replicas.start("a")
    await until(lambda: a.held() == ["default"], 2, "a leads")
    b = await replicas.start("b")
    assert b.beat is not None
    reads = 0

    async def refused() -> list[Candidate]:
        nonlocal reads
        reads += 1
        raise StoreUnavailable("down for the test")

    b.beat.registry.list = refused  # type: ignore[method-assign]
    async with await client_for(create_local_app(b)) as client:
        answers = await asyncio.gather(*(client.get("/leases") for _ in range(50)))
        assert [answer.status for answer in answers] == [200] * 50
    assert reads == 1


async def test_a_replica_just_started_is_a_transfer_target_within_one_beat(
    replicas: Replicas,
) -> None:
    a = await replicas.start("a")
    await until(lambda: a.held() == ["default"], 2, "a leads")
    b = await replicas.start("b", run=False)  # one beat so far: only "seen once"
    await until(lambda: pending(a) == ["b_0000"], 2, "a has seen b's first beat")
    assert a.beat is not None
    wait = math.ceil(a.beat.interval)
    async with await client_for(create_local_app(a)) as client:
        early = await client.post("/leader/transfer", json={"to": "b"})
        assert early.status == 409
        assert early.headers["Retry-After"] == str(wait)
        assert (
            f"b is starting: seen beating once, it is a successor once seen beating "
            f"again, within one beat; retry in {wait} s" in (await early.json())["error"]
        )
        assert a.held() == ["default"]
        # b runs: it beats again at once. a's view, kept by a change stream that tells joins
        # and leaves only, still shows b's first beat; the transfer reads the group again.
        records = replicas.server.groups["default"]
        first = records["b_0000"].version
        replicas.run(b)
        await until(lambda: records["b_0000"].version != first, 2, "b beats again")
        assert pending(a) == ["b_0000"]
        done = await client.post("/leader/transfer", json={"to": "b"})
        assert done.status == 200, await done.text()
        assert await done.json() == {"transferred": ["default"], "successor": "b_0000"}
    await until(lambda: b.held() == ["default"], 2, "b leads")
    assert a.held() == []


async def test_transfer_to_any_finds_a_replica_that_just_started(replicas: Replicas) -> None:
    """Not "successor": null (a release to whoever comes first) because the only other
    replica had been seen beating once."""
    a = await replicas.start("a")
    await until(lambda: a.held() == ["default"], 2, "a leads")
    b = await replicas.start("b", run=False)
    await until(lambda: pending(a) == ["b_0000"], 2, "a has seen b's first beat")
    records = replicas.server.groups["default"]
    first = records["b_0000"].version
    replicas.run(b)
    await until(lambda: records["b_0000"].version != first, 2, "b beats again")
    assert pending(a) == ["b_0000"]
    async with await client_for(create_local_app(a)) as client:
        done = await client.post("/leader/transfer", json={"to": "any"})
        assert done.status == 200, await done.text()
        assert await done.json() == {"transferred": ["default"], "successor": "b_0000"}
    await until(lambda: b.held() == ["default"], 2, "b leads")
