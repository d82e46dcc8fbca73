"""One renewal path: a lease renewing on its own is a batch of one over `RenewsEach`, which
sends exactly the ``renew`` it always sent, and counts and reports it as that ``renew``."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from sidecar.backends.base import LeaseRecord, NotOwned, Renewal, RenewsEach, StoreUnavailable
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.timing import Timing
from tests.support.clock import FakeClock

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)


def renews(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(
        "leader_sidecar_store_requests_total",
        {"lease": "jobs", "lease_group": "jobs", "op": "renew", "outcome": outcome},
    )
    return value or 0.0


async def test_a_batch_of_one_answers_exactly_as_its_renew() -> None:
    """A renewal, a refusal returned in the entry's place, and a store of which nothing is
    known raised — one ``renew`` request each."""
    clock = FakeClock()
    client = MemoryStoreClient(MemoryServer(clock))
    lease = client.lease("jobs")
    granted = await lease.try_acquire("a_0000", 10.0, 0, expected=None)
    each = RenewsEach(client.lease)
    (renewed,) = await each.renew_many([Renewal("jobs", "a_0000", granted.term, 10.0)])
    assert isinstance(renewed, LeaseRecord)
    assert renewed.version != granted.version
    (refused,) = await each.renew_many([Renewal("jobs", "b_0000", granted.term, 10.0)])
    assert isinstance(refused, NotOwned)
    assert await each.renew_many([]) == []

    class Down:
        async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
            raise StoreUnavailable("connection refused")

    down = RenewsEach(lambda name: Down())  # type: ignore[arg-type, return-value]
    with pytest.raises(StoreUnavailable, match="connection refused"):
        await down.renew_many([Renewal("jobs", "a_0000", 1, 10.0)])


async def test_a_lease_renewing_alone_is_counted_as_its_renew() -> None:
    """One request per renewal, counted on the lease's own metrics: ``ok`` when renewed,
    ``not_owned`` when the lease was taken over (the store answered: the probe is not told
    it refuses), as a lease's own ``renew`` always was."""
    clock = FakeClock()
    server = MemoryServer(clock)
    registry = CollectorRegistry()
    elector = Elector(
        MemoryStoreClient(server).lease("jobs"),
        TIMING,
        "a_0000",
        "jobs",
        metrics=Metrics(registry, "jobs", TIMING.lease_duration),
        clock=clock,
        rng=random.Random(7),
    )
    await elector.step()
    assert elector.is_leader()
    clock.advance(TIMING.renew_interval)
    await elector.step()
    assert elector.is_leader()
    assert renews(registry, "ok") == 1
    row = server.state("jobs").row
    assert row is not None
    row.holder, row.term = "x_9999", row.term + 1
    row.version = server.state("jobs").next_version()
    clock.advance(TIMING.renew_interval)
    await elector.step()
    assert not elector.is_leader()
    assert renews(registry, "not_owned") == 1
    assert renews(registry, "ok") == 1
    assert elector.store_answered_within(0.0)
