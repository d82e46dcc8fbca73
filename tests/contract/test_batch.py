"""The batch renewal contract (`RenewsMany`, issue 24): many leases renewed in one request,
each lease's outcome exactly what its own ``renew`` would answer — run against every store
whose client batches (Kubernetes has no multi-object write and renews one Lease a request)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from sidecar.backends.base import (
    LeaseRecord,
    NotOwned,
    Renewal,
    RenewalOutcome,
    RenewsMany,
    StoreClient,
)
from tests.contract.harness import StoreHarness
from tests.contract.test_contract import LEASE, take, watching


def batching(harness: StoreHarness) -> tuple[StoreClient, RenewsMany]:
    client = harness.new_client()
    if not isinstance(client, RenewsMany):
        pytest.skip(f"{client.description} renews each lease with a request of its own")
    return client, client


def renewed(outcome: RenewalOutcome) -> LeaseRecord:
    assert isinstance(outcome, LeaseRecord), f"not renewed: {outcome!r}"
    return outcome


async def requests_of(harness: StoreHarness, client: StoreClient) -> int:
    """Requests ``client`` has sent that write (SQLite: write transactions; etcd: ``Txn``s;
    ZooKeeper: writes and ``multi``s) or run a script (Redis: EVALSHA/EVAL, counted by the
    server; memory: batch calls)."""
    from sidecar.backends.memory import MemoryStoreClient
    from sidecar.backends.sqlite import SQLiteStoreClient

    if isinstance(client, SQLiteStoreClient):
        return client.connection.writes
    if isinstance(client, MemoryStoreClient):
        return client.server.batches
    from sidecar.backends.etcd import EtcdStoreClient

    if isinstance(client, EtcdStoreClient):
        return client.writes
    from sidecar.backends.zookeeper import ZooKeeperStoreClient

    if isinstance(client, ZooKeeperStoreClient):
        return client.writes
    from sidecar.backends.postgresql import PostgresStoreClient

    if isinstance(client, PostgresStoreClient):
        return client.requests
    from sidecar.backends.redis import RedisStoreClient

    assert isinstance(client, RedisStoreClient)
    stats = await client.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def test_one_request_renews_every_lease_still_ours(harness: StoreHarness) -> None:
    """Forty leases, one request: each keeps its holder and term and gets a new version."""
    client, batch = batching(harness)
    names = [f"{harness.lease_name}-{i}" for i in range(40)]
    grants = [await take(client.lease(name), f"a_{i % 3}") for i, name in enumerate(names)]
    # (Redis loads a script on its first use: not counted.)
    await batch.renew_many([Renewal(names[0], "a_0", grants[0].term, LEASE)])
    before = await requests_of(harness, client)
    outcomes = await batch.renew_many(
        [Renewal(n, g.holder or "", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
    )
    assert await requests_of(harness, client) - before == 1
    assert len(outcomes) == len(names)
    for grant, outcome in zip(grants, outcomes, strict=True):
        record = renewed(outcome)
        assert (record.holder, record.term) == (grant.holder, grant.term)
        assert record.version != grant.version
    other = harness.new_client()
    for name, grant in zip(names, grants, strict=True):
        seen = await other.lease(name).read()
        assert seen is not None
        assert (seen.holder, seen.term) == (grant.holder, grant.term)
        assert seen.version != grant.version


async def test_a_lease_taken_over_is_not_owned_and_the_others_renew(
    harness: StoreHarness,
) -> None:
    """No all-or-nothing: the lease another replica took answers NotOwned with its record and
    is left as it is; the leases on either side of it renew."""
    client, batch = batching(harness)
    thief = harness.new_client()
    names = [f"{harness.lease_name}-{i}" for i in range(3)]
    grants = [await take(client.lease(name), "a_1") for name in names]
    stolen = await take(thief.lease(names[1]), "b_1")
    outcomes = await batch.renew_many(
        [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
    )
    assert renewed(outcomes[0]).holder == renewed(outcomes[2]).holder == "a_1"
    refused = outcomes[1]
    assert isinstance(refused, NotOwned)
    assert refused.record is not None
    assert (refused.record.holder, refused.record.term) == ("b_1", stolen.term)
    after = await thief.lease(names[1]).read()
    assert after is not None
    assert (after.holder, after.term, after.version) == ("b_1", stolen.term, stolen.version)


async def test_a_released_lease_and_a_stale_term_change_nothing(harness: StoreHarness) -> None:
    client, batch = batching(harness)
    names = [f"{harness.lease_name}-{i}" for i in range(3)]
    grants = [await take(client.lease(name), "a_1") for name in names]
    released = await client.lease(names[0]).release("a_1", grants[0].term)
    assert released is not None
    outcomes = await batch.renew_many(
        [
            Renewal(names[0], "a_1", grants[0].term, LEASE),  # released
            Renewal(names[1], "a_1", grants[1].term - 1, LEASE),  # an older term of ours
            Renewal(names[2], "c_1", grants[2].term, LEASE),  # someone else's
        ]
    )
    assert all(isinstance(o, NotOwned) for o in outcomes), outcomes
    other = harness.new_client()
    record = await other.lease(names[0]).read()
    assert record is not None
    assert record.free
    assert record.version == released.version
    for name, grant in zip(names[1:], grants[1:], strict=True):
        record = await other.lease(name).read()
        assert record is not None
        assert record.version == grant.version


async def test_a_grant_the_store_lost_is_put_back_in_the_batch(harness: StoreHarness) -> None:
    """As ``renew`` does: the lease the store forgot comes back with our holder and term, and
    the store's term is raised to it (the next grant is above it, rule 5)."""
    client, batch = batching(harness)
    names = [harness.lease_name, f"{harness.lease_name}-kept"]
    await take(client.lease(names[0]), "a_1", min_term=6)
    grants = [await client.lease(names[0]).read(), await take(client.lease(names[1]), "a_1")]
    assert grants[0] is not None
    assert grants[0].term == 7
    await harness.reset()  # the store forgets the first lease, term included
    outcomes = await batch.renew_many(
        [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
    )
    restored = renewed(outcomes[0])
    assert (restored.holder, restored.term) == ("a_1", 7)
    assert renewed(outcomes[1]).term == grants[1].term
    await client.lease(names[0]).release("a_1", 7)
    assert (await take(harness.new_client().lease(names[0]), "b_1")).term == 8


async def test_a_batch_ends_a_hand_over(harness: StoreHarness) -> None:
    """The first renewal of a handed grant clears ``handed``, in a batch as alone."""
    client, batch = batching(harness)
    store = client.lease(harness.lease_name)
    if not store.hands_over:
        pytest.skip(f"{store.description} does not hand over")
    granted = await take(store, "a_1")
    handed = await store.hand_over(
        "a_1", granted.term, successor="b_1", handed="77", duration=LEASE, min_term=0
    )
    (outcome,) = await batch.renew_many([Renewal(harness.lease_name, "b_1", handed.term, LEASE)])
    assert (renewed(outcome).holder, renewed(outcome).handed) == ("b_1", None)


async def test_every_watch_sees_its_lease_renewed_by_a_batch(harness: StoreHarness) -> None:
    """Followers time each lease from its versions (rule 2): a batch's writes reach every
    lease's watch as single renewals do."""
    client, batch = batching(harness)
    names = [f"{harness.lease_name}-{i}" for i in range(5)]
    grants = [await take(client.lease(name), "a_1") for name in names]
    follower = harness.new_client()
    async with watching_all(follower, names) as queues:
        for queue in queues:
            await asyncio.wait_for(queue.get(), timeout=5.0)  # the first yield: as it is
        outcomes = await batch.renew_many(
            [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
        )
        for queue, outcome in zip(queues, outcomes, strict=True):
            while True:
                seen = await asyncio.wait_for(queue.get(), timeout=5.0)
                if seen is not None and seen.version == renewed(outcome).version:
                    break


async def test_an_empty_batch_sends_nothing(harness: StoreHarness) -> None:
    client, batch = batching(harness)
    before = await requests_of(harness, client)
    assert await batch.renew_many([]) == []
    assert await requests_of(harness, client) == before


@contextlib.asynccontextmanager
async def watching_all(
    client: StoreClient, names: list[str]
) -> AsyncIterator[list[asyncio.Queue[LeaseRecord | None]]]:
    """`watching` for several leases of one client at once."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(watching(client.lease(n))) for n in names]
