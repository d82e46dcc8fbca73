"""One `RedisStoreClient` for many leases, against a real redis-server: what it shares (one
pool, one pub/sub connection, one epoch), counted on the server with ``CLIENT LIST``, and the
candidate registry's keys, garbage collection and ACL."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from sidecar.backends.base import Candidate, LeaseRecord, StoreUnavailable
from sidecar.backends.redis import RedisStoreClient, candidates_key, lease_keys, parse_target
from sidecar.backends.redis.reads import WatchReads
from tests.redis.servers import RedisServer
from tests.redis.test_redis_store import documented_acl

pytestmark = pytest.mark.slow

NAME = "leader-sidecar:many"  # the client name every connection of the client under test has


@contextlib.asynccontextmanager
async def client_of(url: str, **options: object) -> AsyncIterator[RedisStoreClient]:
    client = RedisStoreClient(parse_target(url), client_name=NAME, **options)  # type: ignore[arg-type]
    try:
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def watching_all(
    client: RedisStoreClient, names: list[str]
) -> AsyncIterator[dict[str, asyncio.Queue[LeaseRecord | None]]]:
    """Every lease's watch running, its yields in a queue per lease."""
    queues: dict[str, asyncio.Queue[LeaseRecord | None]] = {n: asyncio.Queue() for n in names}

    async def follow(name: str) -> None:
        async for record in client.lease(name).watch():
            await queues[name].put(record)

    tasks = [asyncio.create_task(follow(name)) for name in names]
    try:
        yield queues
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert all(task.cancelled() for task in tasks), "a watch ended on its own"


def connections_of(server: RedisServer, name: str) -> list[dict[str, object]]:
    with server.client() as admin:
        return [c for c in admin.client_list() if c.get("name") == name]


async def first_yields(queues: dict[str, asyncio.Queue[LeaseRecord | None]]) -> None:
    await asyncio.wait_for(asyncio.gather(*(q.get() for q in queues.values())), timeout=20)


async def test_a_thousand_leases_on_one_client_use_one_pubsub_connection_and_one_pool(
    server: RedisServer,
) -> None:
    """1,000 watches and 1,000 concurrent requests: the server sees one subscriber connection
    (subscribed to all 1,000 channels) and at most the pool's request connections."""
    names = [f"many-{i}" for i in range(1000)]
    async with client_of(server.url) as client, watching_all(client, names) as queues:
        await first_yields(queues)  # every watch subscribed and read its lease
        records = await asyncio.gather(*(client.lease(name).read() for name in names))
        assert records == [None] * 1000
        grants = await asyncio.gather(
            *(client.lease(name).try_acquire("a_1", 30.0, 0, expected=None) for name in names)
        )
        assert {g.term for g in grants} == {1}
        connections = connections_of(server, NAME)
        subscribers = [c for c in connections if int(str(c["sub"])) > 0]
        assert len(subscribers) == 1, subscribers
        assert int(str(subscribers[0]["sub"])) == 1000
        requests = [c for c in connections if int(str(c["sub"])) == 0]
        assert 1 <= len(requests) <= RedisStoreClient.MAX_CONNECTIONS
        assert client.hub.connections == 1
        # Each watch heard its own grant through that one connection.
        for name, grant in zip(names, grants, strict=True):
            while True:
                record = await asyncio.wait_for(queues[name].get(), timeout=5)
                if record is not None and record.version == grant.version:
                    break


async def test_a_server_restart_makes_every_watch_of_the_client_read_again(
    server: RedisServer,
) -> None:
    """The one pub/sub connection reconnects once for all leases; every watch then yields
    what the (empty) server holds, and versions seen before carry an older epoch."""
    names = [f"restart-{i}" for i in range(20)]
    async with client_of(server.url) as holder, client_of(server.url) as follower:
        grants = [await holder.lease(n).try_acquire("a_1", 30.0, 0, expected=None) for n in names]
        async with watching_all(follower, names) as queues:
            seen = [await asyncio.wait_for(queues[n].get(), 5) for n in names]
            assert [r.holder if r else None for r in seen] == ["a_1"] * 20
            server.restart()
            for name in names:
                while (await asyncio.wait_for(queues[name].get(), 10)) is not None:
                    pass  # renewals published before the restart, if any
            restored = await holder.lease(names[0]).renew("a_1", grants[0].term, 30.0)
            record = await asyncio.wait_for(queues[names[0]].get(), 5)
            assert record is not None
            assert record.term == grants[0].term
            assert record.version.rpartition("~")[0] == restored.version.rpartition("~")[0]
            assert record.version.rpartition("~")[2] != seen[0].version.rpartition("~")[2]
        assert len([c for c in connections_of(server, NAME) if int(str(c["sub"])) > 0]) <= 1


async def test_a_watch_that_ends_unsubscribes_its_channel_and_the_last_closes_the_connection(
    server: RedisServer,
) -> None:
    async with client_of(server.url) as client:
        async with watching_all(client, ["one", "two"]) as queues:
            await first_yields(queues)
            async with watching_all(client, ["three"]) as more:
                await first_yields(more)
            await asyncio.sleep(0.3)  # the hub unsubscribes between polls
            (subscriber,) = [c for c in connections_of(server, NAME) if int(str(c["sub"])) > 0]
            assert int(str(subscriber["sub"])) == 2
        await asyncio.sleep(0.3)
        assert [c for c in connections_of(server, NAME) if int(str(c["sub"])) > 0] == []


def script_calls(server: RedisServer) -> int:
    """EVALSHA and EVAL calls the server answered since its stats were reset."""
    with server.client() as admin:
        stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def test_a_thousand_watches_read_their_records_in_a_few_requests_each_its_own(
    server: RedisServer,
) -> None:
    """Every watch reads its record when its channel is subscribed: 1,000 at once at a
    sidecar's start. One script per read made 1,000 requests whose round trips took the CPU
    the renewals needed (issue 24); batched, a handful — and each lease still gets its own
    record, including one whose key holds something that is not a record."""
    names = [f"batch-{i}" for i in range(1000)]
    async with client_of(server.url) as holder:
        grants = {
            n: await holder.lease(n).try_acquire("a_1", 30.0, 0, expected=None) for n in names[:5]
        }
    with server.client() as admin:
        admin.set(lease_keys(names[7])[0], "not json")
        admin.config_resetstat()
    async with client_of(server.url) as client, watching_all(client, names) as queues:
        first = dict(
            zip(
                names,
                await asyncio.wait_for(
                    asyncio.gather(*(queues[n].get() for n in names)), timeout=20
                ),
                strict=True,
            )
        )
        reads = script_calls(server)
        assert reads <= 2 * -(-1000 // WatchReads.MOST) + 2, reads  # (was 1,000)
    for name, grant in grants.items():
        record = first[name]
        assert record is not None
        assert record.holder == "a_1"
        assert record.version == grant.version  # the same epoch (0) on both clients
    unreadable = first[names[7]]
    assert unreadable is not None
    assert unreadable.unreadable is not None
    assert all(first[n] is None for n in names[5:] if n != names[7])


async def test_a_lease_whose_key_cannot_be_read_fails_its_own_read_not_the_others(
    server: RedisServer,
) -> None:
    """A key of another type makes READ fail; in a batch that is that lease's failure alone
    (as its own read's would be, without a new epoch), and every other lease is answered."""
    with server.client() as admin:
        admin.hset(lease_keys("wrong")[0], "field", "value")
    async with client_of(server.url) as client:
        granted = await client.lease("right").try_acquire("a_1", 30.0, 0, expected=None)
        epoch = client.epoch
        wrong, right = await asyncio.gather(
            client.watch_reads.read("wrong"), client.watch_reads.read("right"),
            return_exceptions=True,
        )  # fmt: skip
        assert isinstance(wrong, StoreUnavailable), wrong
        assert "unexpected value" in str(wrong)
        assert lease_keys("wrong")[0] in str(wrong)
        assert isinstance(right, LeaseRecord)
        assert right.version == granted.version
        assert client.epoch == epoch


async def test_a_foreign_value_in_one_lease_does_not_restart_every_other_leases_count(
    server: RedisServer,
) -> None:
    """The epoch is the client's: a key something else wrote (a record that cannot be read,
    issue 25) says nothing about lost writes, and must not give every other lease a new
    version on every read, or no follower would ever see one unchanged for a lease."""
    bad_holder, _, _ = lease_keys("bad")
    with server.client() as admin:
        admin.set(bad_holder, "not json")
    async with client_of(server.url) as client:
        good = client.lease("good")
        granted = await good.try_acquire("a_1", 30.0, 0, expected=None)
        for _ in range(3):
            bad = await client.lease("bad").read()
            assert bad is not None
            assert bad.unreadable is not None
            seen = await good.read()
            assert seen is not None
            assert seen.version == granted.version


async def test_an_outage_starts_one_new_epoch_not_one_per_failed_request(
    server: RedisServer,
) -> None:
    async with client_of(server.url, request_timeout=0.3) as client:
        before = await client.lease("x").try_acquire("a_1", 30.0, 0, expected=None)
        server.pause()
        try:
            for name in ("x", "y", "x"):
                with pytest.raises(StoreUnavailable):
                    await client.lease(name).read()
        finally:
            server.resume()
        after = await client.lease("x").read()
        assert after is not None
        _, _, epoch_before = before.version.rpartition("~")
        _, _, epoch_after = after.version.rpartition("~")
        assert int(epoch_after) == int(epoch_before) + 1


async def test_a_request_builds_a_client_of_its_own_only_for_wait(server: RedisServer) -> None:
    """Building redis-py's single-connection client cost more than the request itself, so a
    request has one only when ``WAIT`` must follow its script on the same connection
    (``--redis-min-replicas``); otherwise the shared client picks a pooled connection."""
    for min_replicas in (0, 1):
        async with client_of(server.url, min_replicas=min_replicas, wait_timeout=0.05) as client:
            built = counting_clients(client)
            lease = client.lease(f"own-client-{min_replicas}")
            for _ in range(20):
                assert await lease.read() is None
            assert len(built) == 20 * min_replicas
            requests = [c for c in connections_of(server, NAME) if int(str(c["sub"])) == 0]
            assert len(requests) == 1, requests


def counting_clients(client: RedisStoreClient) -> list[Redis]:
    """Every single-connection client ``client`` builds from now on."""
    built: list[Redis] = []
    build = client.redis.client

    def counted() -> Redis:
        built.append(build())
        return built[-1]

    client.redis.client = counted  # type: ignore[method-assign]
    return built


# -- candidates -----------------------------------------------------------------------------


class SteppedClock:
    """Wall time the test moves (the candidates' garbage collection reads it)."""

    def __init__(self) -> None:
        self.at = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def now(self) -> float:
        return 0.0

    def wall(self) -> datetime:
        return self.at


async def test_a_group_is_one_hash_of_json_a_human_can_read(server: RedisServer) -> None:
    async with client_of(server.url) as client:
        group = client.candidates("web")
        await group.beat(Candidate("a_1", "", "rev-1", 2, False, None), 15.0)
        with server.client() as admin:
            stored = admin.hgetall(candidates_key("web"))
            ttl = admin.pttl(candidates_key("web"))
        assert candidates_key("web") == "leader-sidecar:candidates:{web}"
        value = json.loads(stored["a_1"])
        assert (value["revision"], value["priority"], value["leaving"]) == ("rev-1", 2, False)
        assert 299_000 < ttl <= 300_000  # 20 leases of 15 s: garbage collection only


async def test_candidates_silent_for_twenty_leases_are_collected_by_the_next_beat(
    server: RedisServer,
) -> None:
    clock = SteppedClock()
    async with client_of(server.url, clock=clock) as client:
        group = client.candidates("web")
        await group.beat(Candidate("old_1", "", "", 0, False, None), 2.0)
        clock.at += timedelta(seconds=59)  # 20 leases of 2 s is under the 60 s minimum
        await group.beat(Candidate("new_1", "", "", 0, False, None), 2.0)
        assert {c.identity for c in await group.list()} == {"old_1", "new_1"}
        clock.at += timedelta(seconds=2)  # old_1 silent for 61 s
        await group.beat(Candidate("new_1", "", "", 0, False, None), 2.0)
        assert [c.identity for c in await group.list()] == ["new_1"]
        with server.client() as admin:  # the hash lives as long as its longest-lived record
            assert 59_000 < admin.pttl(candidates_key("web")) <= 60_000

    async with client_of(server.url, clock=clock) as client:
        group = client.candidates("quiet")
        await group.beat(Candidate("long_1", "", "", 0, False, None), 30.0)  # 600 s
        await group.beat(Candidate("short_1", "", "", 0, False, None), 2.0)  # 60 s
        with server.client() as admin:  # a shorter-lived beat never shortens the hash's life
            assert 599_000 < admin.pttl(candidates_key("quiet")) <= 600_000


async def test_the_documented_acl_is_enough_for_the_candidate_registry(
    server: RedisServer,
) -> None:
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "sidecar", *documented_acl().split())
    url = f"redis://sidecar:pw@127.0.0.1:{server.port}/0"
    async with client_of(url) as client:
        group = client.candidates("web")
        await group.beat(Candidate("a_1", "", "", 0, False, None), 5.0)
        assert [c.identity for c in await group.list()] == ["a_1"]
        await group.leave("a_1")
        assert await group.list() == []
    with server.client() as admin:
        assert admin.execute_command("ACL", "LOG") == []  # nothing was refused


async def test_connections_name_the_redis_py_version_without_reading_package_metadata(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py 8 looks its own version up in every installed package's metadata for each
    connection it makes (milliseconds of CPU, the first between a sidecar's first answer and
    its first grant); the client gives it instead."""
    import importlib.metadata

    import redis

    looked_up: list[str] = []

    def version(name: str) -> str:
        looked_up.append(name)
        return "0"

    monkeypatch.setattr(importlib.metadata, "version", version)
    async with client_of(server.url) as client:
        await client.lease("metadata").read()
        await client.candidates("metadata").list()
    assert looked_up == []
    assert redis.__version__
