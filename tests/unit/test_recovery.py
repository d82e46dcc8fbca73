"""Recovery in one round trip (issue 34): when the store answers again — the sidecar's probe
finds it back, or a watch resumes after a reconnection and reads the lease — a leader whose
renewal failed renews at once instead of a retry period later, so a deadline still ahead
keeps its term. Requests counted at the store, in real (short) time."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.backends.memory import MemoryServer
from sidecar.lease_set import LeaseSet
from sidecar.metrics import Metrics
from sidecar.timing import Timing
from tests.support.refusing import RefusingClient, Switch

# Lease 3 s, renew every second, retry every second (jittered x1 to 1.5): a leader whose renewal
# failed waits 1 to 1.5 s before the next, out of the 2.5 s its deadline leaves.
TIMING = Timing.build(3.0, 1.0, 1.0, 0.5)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


@pytest.fixture
async def leader() -> AsyncIterator[tuple[LeaseSet, Switch]]:
    switch = Switch()
    registry = CollectorRegistry()
    lease_set = LeaseSet.open(
        RefusingClient(MemoryServer(), switch),
        [("jobs", "jobs")],
        TIMING,
        "a_0000",
        group="jobs",
        registry_metrics=lambda lease: Metrics(registry, lease, TIMING.lease_duration),
        rng=random.Random(5),
    )
    await lease_set.prime(0.1)
    running = asyncio.create_task(lease_set.run())
    await until(lambda: lease_set.primary.is_leader(), 3, "a leads")
    yield lease_set, switch
    lease_set.stop()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


async def failed_renewal(switch: Switch) -> float:
    """Refuse until the leader's next renewal has failed; return when it did."""
    switch.refusing = True
    began = time.monotonic()
    await until(lambda: switch.since(began)["renew"] >= 1, 2 * TIMING.renew_interval, "a renewal")
    switch.refusing = False
    return time.monotonic()


def renewals_since(switch: Switch, moment: float) -> int:
    return switch.since(moment)["renew"]


async def test_a_leader_whose_renewal_failed_renews_as_soon_as_the_probe_finds_the_store_back(
    leader: tuple[LeaseSet, Switch],
) -> None:
    lease_set, switch = leader
    elector = lease_set.primary
    term = elector.status().term
    await failed_renewal(switch)
    assert lease_set.probe is not None
    assert lease_set.probe.refusing
    back = time.monotonic()
    lease_set.probe.answered()  # the probe's read (or any request) got an answer
    waited = await until(lambda: renewals_since(switch, back) >= 1, 1.0, "a renewal")
    assert waited < 0.1, "the renewal waited for its retry period"
    await until(lambda: elector.seconds_since_renewal() < 0.2, 1.0, "renewed")
    assert elector.is_leader()
    assert elector.status().term == term


async def test_a_leader_whose_renewal_failed_renews_as_soon_as_its_watch_reads_the_lease_again(
    leader: tuple[LeaseSet, Switch],
) -> None:
    """A watch that resumed after a reconnection reads the record (the PostgreSQL LISTEN
    session on a promoted standby, Redis pub/sub after a restart): that answer is the store
    back, and the renewal goes then."""
    lease_set, switch = leader
    elector = lease_set.primary
    term = elector.status().term
    await failed_renewal(switch)
    record = await elector.store.read()
    back = time.monotonic()
    elector.on_watch(record)
    waited = await until(lambda: renewals_since(switch, back) >= 1, 1.0, "a renewal")
    assert waited < 0.1, "the renewal waited for its retry period"
    await until(lambda: elector.seconds_since_renewal() < 0.2, 1.0, "renewed")
    assert elector.status().term == term


async def test_the_store_answering_never_brings_a_renewal_before_its_retry_after(
    leader: tuple[LeaseSet, Switch],
) -> None:
    """A good neighbour: the store asked for 0.6 s; an answer elsewhere does not undercut it."""
    lease_set, switch = leader
    elector = lease_set.primary
    switch.retry_after = 0.6
    failed = await failed_renewal(switch)
    switch.retry_after = None
    assert lease_set.probe is not None
    lease_set.probe.answered()
    elector.on_watch(await elector.store.read())
    await until(lambda: renewals_since(switch, failed) >= 1, 2.0, "a renewal")
    first = min(at for at, op in switch.requests if op == "renew" and at >= failed)
    assert first - failed >= 0.6 - 0.05


async def test_a_leader_on_its_usual_beat_is_not_renewed_early_by_an_answer(
    leader: tuple[LeaseSet, Switch],
) -> None:
    """Only a renewal that failed goes early: every renewal's own echo comes back through the
    watch, and must not double the writes."""
    lease_set, switch = leader
    elector = lease_set.primary
    await asyncio.sleep(0.2)  # past the grant's first moments
    began = time.monotonic()
    for _ in range(5):
        elector.on_watch(await elector.store.read())
        assert lease_set.probe is not None
        lease_set.probe.answered()
        await asyncio.sleep(0.05)
    assert renewals_since(switch, began) <= 1  # at most the one its beat brought
