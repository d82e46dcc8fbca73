"""The Redis store against a real redis-server: what the contract suite cannot see from the
outside — the key's garbage-collection TTL, the term counter, a key that vanished, pub/sub,
versions and their epoch, error mapping, bounded requests, WAIT."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from sidecar.backends.base import LeaseHeld, LeaseRecord, NotOwned, Renewal, StoreUnavailable
from sidecar.backends.redis import RedisLeaseStore, lease_keys
from sidecar.supervisor import Supervisor
from tests.redis.conftest import StoreFactory
from tests.redis.servers import RedisServer, wait_until
from tests.redis.watching import next_matching, watching
from tests.support.tools import REPO

pytestmark = pytest.mark.slow

HOLDER, TERM, CHANNEL = lease_keys("t")


async def take(
    store: RedisLeaseStore, identity: str, duration: float, min_term: int = 0
) -> LeaseRecord:
    """Acquire naming exactly what the store holds now, as a candidate that watched it expire
    (or saw it released, or found nothing at all) would."""
    current = await store.read()
    return await store.try_acquire(
        identity, duration, min_term, expected=current.version if current else None
    )


def stored_version(version: str) -> str:
    """A reported version without the store's epoch suffix (``<token>~<epoch>``)."""
    stored, tilde, _epoch = version.rpartition("~")
    assert tilde, f"a Redis version carries its epoch: {version!r}"
    return stored


# -- the lease in Redis ---------------------------------------------------------------------


async def test_the_servers_ttl_is_garbage_collection_many_leases_long_never_the_lease(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """The holder key's PX TTL is 20 leases (at least 60 s), set again on every write: a key
    nobody renews goes away some day, but the TTL never ends a lease (rule 2). Past its lease
    duration the record is still there, unchanged, for the followers to time; the counter
    never expires."""
    store = make_store(server.url)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    with server.client() as client:
        assert 99_000 < client.pttl(HOLDER) <= 100_000  # 20 leases of 5 s
        assert client.ttl(TERM) == -1  # the counter never expires
    short = make_store(server.url, lease="short")
    brief = await short.try_acquire("a_1", 0.4, 0, expected=None)
    short_holder, _, _ = lease_keys("short")
    with server.client() as client:
        assert 59_000 < client.pttl(short_holder) <= 60_000  # 20 leases of 0.4 s < 60 s
    await asyncio.sleep(0.4 * 2)  # twice the lease: nothing at the store changes
    held = await short.read()
    assert held is not None
    assert (held.holder, held.term, held.version) == ("a_1", brief.term, brief.version)
    assert not held.free
    renewed = await store.renew("a_1", granted.term, 5.0)
    assert renewed.version != granted.version
    with server.client() as client:
        assert 99_000 < client.pttl(HOLDER) <= 100_000  # set again by the renewal


async def test_the_value_is_json_a_human_can_read_with_redis_cli(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A grant: holder, term, duration, version, wall times for humans. A release keeps the key
    (and the term) and says so: {"term", "released": true, "version"}."""
    store = make_store(server.url)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    with server.client() as client:
        value = json.loads(client.get(HOLDER))
    assert value["holder"] == "a_1"
    assert value["term"] == granted.term
    assert value["duration_ms"] == 5000
    assert value["version"] == stored_version(granted.version)
    assert value["acquired_at"] == value["renewed_at"]
    assert granted.acquired_at is not None
    assert value["acquired_at"] == granted.acquired_at.isoformat()
    released = await store.release("a_1", granted.term)
    assert released is not None
    with server.client() as client:
        value = json.loads(client.get(HOLDER))
    assert value.get("holder") is None
    assert (value["term"], value["released"]) == (granted.term, True)
    assert value["version"] == stored_version(released.version)
    assert value["version"] != stored_version(granted.version)


async def test_a_grant_raises_the_counter_to_the_callers_high_water_mark(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """When min_term wins over INCR, the counter is set to the new term, so the next grant by
    a caller that knows no high-water mark still goes above it."""
    store = make_store(server.url)
    first = await store.try_acquire("a_1", 5.0, 41, expected=None)
    assert first.term == 42
    with server.client() as client:
        assert client.get(TERM) == "42"
    await store.release("a_1", 42)
    second = await take(store, "b_1", 5.0)
    assert second.term == 43


async def test_a_vanished_key_is_waited_out_not_free_and_its_holder_puts_it_back(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A holder key gone before its time (the Redis host's clock stepped past the TTL) leaves
    the counter: that reads as a record with no holder, *not* released, of version
    ``absent.<counter>`` — followers wait it out like a held lease. The holder's next renewal
    puts the grant back with the same term; a grant by someone else is never overwritten."""
    store, other = make_store(server.url), make_store(server.url)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    with server.client() as client:
        client.pexpire(HOLDER, 1)
    wait_until(lambda: not server.client().exists(HOLDER), 2.0, "the key expired")
    gone = await other.read()
    assert gone is not None
    assert (gone.holder, gone.term, gone.released, gone.free) == (None, granted.term, False, False)
    assert stored_version(gone.version) == f"absent.{granted.term}"
    with pytest.raises(LeaseHeld):  # a candidate must name what is there
        await other.try_acquire("b_1", 5.0, 0, expected=None)
    restored = await store.renew("a_1", granted.term, 5.0)
    assert (restored.holder, restored.term) == ("a_1", granted.term)
    with server.client() as client:
        assert json.loads(client.get(HOLDER))["restored"] is True
        assert client.get(TERM) == str(granted.term)
    with pytest.raises(LeaseHeld):  # the absent record a follower timed is gone
        await other.try_acquire("b_1", 5.0, 0, expected=gone.version)

    # The key vanishes again, and this time a follower that waited it out takes the lease
    # first: the old holder's renewal must not overwrite that later grant.
    with server.client() as client:
        client.delete(HOLDER)
    gone = await other.read()
    assert gone is not None
    taken = await other.try_acquire("b_1", 5.0, 0, expected=gone.version)
    assert (taken.holder, taken.term) == ("b_1", granted.term + 1)
    with pytest.raises(NotOwned) as refused:
        await store.renew("a_1", granted.term, 5.0)
    assert refused.value.record is not None
    assert (refused.value.record.holder, refused.value.record.term) == ("b_1", taken.term)


async def test_a_refused_candidate_is_told_the_record_to_time_the_lease_by(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Followers time expiry themselves (rule 2): a refusal carries the holder, its declared
    duration and the exact version held now, so the follower can start its own count, and a
    renewal in between makes that version stale."""
    a, b = make_store(server.url), make_store(server.url)
    granted = await a.try_acquire("a_1", 3.0, 0, expected=None)
    await asyncio.sleep(0.3)
    with pytest.raises(LeaseHeld) as held:
        await b.try_acquire("b_1", 3.0, 0, expected=None)
    record = held.value.record
    assert record is not None
    assert (record.holder, record.term, record.duration) == ("a_1", granted.term, 3.0)
    assert not record.free
    assert stored_version(record.version) == stored_version(granted.version)
    await a.renew("a_1", granted.term, 3.0)
    with pytest.raises(LeaseHeld) as stale:
        await b.try_acquire("b_1", 3.0, 0, expected=record.version)
    assert stale.value.record is not None
    assert stale.value.record.version != record.version


async def test_grants_and_releases_are_published_on_the_lease_channel(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Every write is published, renewals included: followers time expiry by versions, so
    they must see each new one at once (rule 2)."""
    with server.client() as client, client.pubsub() as pubsub:
        pubsub.subscribe(CHANNEL)
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"
        store = make_store(server.url)
        granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
        renewed = await store.renew("a_1", granted.term, 5.0)
        released = await store.release("a_1", granted.term)
        assert released is not None
        messages = []
        while (message := pubsub.get_message(timeout=0.5)) is not None:
            messages.append(json.loads(message["data"]))
    assert [(m.get("holder"), m["term"], m.get("released")) for m in messages] == [
        ("a_1", granted.term, None),
        ("a_1", granted.term, None),
        (None, granted.term, True),
    ]
    assert [m["version"] for m in messages] == [
        stored_version(r.version) for r in (granted, renewed, released)
    ]
    assert len({m["version"] for m in messages}) == 3


async def test_a_foreign_value_in_the_key_is_a_record_of_unknown_holder_taken_only_over_it(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Something else writing our key must not crash the elector or look like a free lease
    (issue 25): it reads as a record that cannot be read, and a grant goes only over exactly
    that value, named by a digest of it."""
    with server.client() as client:
        client.set(HOLDER, "not json")
    store = make_store(server.url)
    found = await store.read()
    assert found is not None
    assert found.unreadable is not None
    assert "not a JSON object" in found.unreadable
    assert (found.holder, found.term, found.free, found.forgotten) == (None, 0, False, False)
    with pytest.raises(LeaseHeld) as held:
        await store.try_acquire("a_1", 5.0, 0, expected=None)
    assert held.value.record == found
    granted = await store.try_acquire("a_1", 5.0, 41, expected=found.version)
    assert (granted.holder, granted.term, granted.unreadable) == ("a_1", 42, None)


async def test_a_foreign_value_fails_only_its_own_lease_in_a_batch(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A partial failure is per lease: the lease whose key holds something else answers
    NotOwned with a record that cannot be read, and the others in the same script renew."""
    store = make_store(server.url)
    others = [make_store(server.url, lease=name) for name in ("u", "v")]
    grants = [await o.try_acquire("a_1", 5.0, 0, expected=None) for o in others]
    with server.client() as client:
        client.set(HOLDER, "not json")
    outcomes = await store.client.renew_many(
        [
            Renewal("u", "a_1", grants[0].term, 5.0),
            Renewal("t", "a_1", 1, 5.0),
            Renewal("v", "a_1", grants[1].term, 5.0),
        ]
    )
    assert isinstance(outcomes[1], NotOwned)
    assert outcomes[1].record is not None
    assert outcomes[1].record.unreadable is not None
    for outcome, grant in zip((outcomes[0], outcomes[2]), grants, strict=True):
        assert isinstance(outcome, LeaseRecord)
        assert (outcome.holder, outcome.term) == ("a_1", grant.term)
        assert outcome.version != grant.version
    with server.client() as client:
        assert client.get(HOLDER) == "not json"


async def test_a_version_seen_before_the_connection_failed_is_no_basis_for_a_grant(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Every failed request bumps the store's epoch (the server may have restarted and lost
    writes): a version observed before it is refused even though the stored record did not
    change, with the record as seen now, under a new epoch, which a follower times anew."""
    holder, follower = make_store(server.url), make_store(server.url, request_timeout=0.3)
    granted = await holder.try_acquire("a_1", 5.0, 0, expected=None)
    seen = await follower.read()
    assert seen is not None
    server.pause()
    try:
        with pytest.raises(StoreUnavailable):
            await follower.read()
    finally:
        server.resume()
    with pytest.raises(LeaseHeld) as refused:
        await follower.try_acquire("b_1", 5.0, 0, expected=seen.version)
    now = refused.value.record
    assert now is not None
    assert (now.holder, now.term) == ("a_1", granted.term)
    assert stored_version(now.version) == stored_version(seen.version)  # nothing was written
    assert now.version != seen.version
    taken = await follower.try_acquire("b_1", 5.0, 0, expected=now.version)
    assert (taken.holder, taken.term) == ("b_1", granted.term + 1)


# -- failures are StoreUnavailable, and bounded ---------------------------------------------


async def test_a_stopped_server_is_unavailability_not_a_crash(
    server: RedisServer, make_store: StoreFactory
) -> None:
    store = make_store(server.url)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    server.stop()
    for call in (
        store.read,
        lambda: store.try_acquire("b_1", 5.0, 0, expected=None),
        lambda: store.try_acquire("b_1", 5.0, 0, expected=granted.version),
        lambda: store.renew("a_1", 1, 5.0),
        lambda: store.release("a_1", 1),
    ):
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{server.port}"):
            await call()


async def test_every_request_is_bounded_by_the_request_timeout_when_the_server_stalls(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """SIGSTOP: the TCP connection stays up, nothing answers. Each call gives up in time."""
    store = make_store(server.url, request_timeout=0.3)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    server.pause()
    try:
        for call in (
            store.read,
            lambda: store.try_acquire("b_1", 5.0, 0, expected=None),
            lambda: store.try_acquire("b_1", 5.0, 0, expected=granted.version),
            lambda: store.renew("a_1", granted.term, 5.0),
            lambda: store.release("a_1", granted.term),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"no answer within 0\.3s"):
                await call()
            assert time.monotonic() - started < 0.3 + 0.4
    finally:
        server.resume()
    renewed = await store.renew("a_1", granted.term, 5.0)  # the store recovers by itself
    assert renewed.term == granted.term


async def test_the_first_request_after_a_server_restart_succeeds(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A pooled connection that died while idle is replaced once, without failing."""
    store = make_store(server.url)
    await store.try_acquire("a_1", 5.0, 0, expected=None)
    server.restart()
    assert await store.read() is None  # nothing was persisted


async def test_a_replica_answers_unavailability_saying_it_is_read_only(
    tmp_path: Path, server: RedisServer, make_store: StoreFactory
) -> None:
    (tmp_path / "replica").mkdir()
    replica = RedisServer.start(tmp_path / "replica")
    try:
        replica.replicate(server)
        store = make_store(replica.url)
        with pytest.raises(StoreUnavailable, match="read-only replica"):
            await store.try_acquire("a_1", 5.0, 0, expected=None)
    finally:
        replica.stop()


async def test_the_servers_own_min_replicas_to_write_is_unavailability(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    (tmp_path / "p").mkdir()
    primary = RedisServer.start(tmp_path / "p", ["--min-replicas-to-write", "1"])
    try:
        store = make_store(primary.url)
        with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
            await store.try_acquire("a_1", 5.0, 0, expected=None)
        assert await store.read() is None  # reading still works
    finally:
        primary.stop()


async def test_a_wrong_password_is_unavailability_that_names_the_setting(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    (tmp_path / "p").mkdir()
    guarded = RedisServer.start(tmp_path / "p", password="right horse")
    try:
        url = f"redis://127.0.0.1:{guarded.port}/0"
        for store in (make_store(url), make_store(url, password="wrong")):
            with pytest.raises(StoreUnavailable, match="LEADER_SIDECAR_REDIS_PASSWORD"):
                await store.read()
        with_flag = make_store(f"redis://:wrong@127.0.0.1:{guarded.port}/0", password="right horse")
        granted = await with_flag.try_acquire("a_1", 5.0, 0, expected=None)
        assert granted.holder == "a_1"
    finally:
        guarded.stop()


# -- the watch ------------------------------------------------------------------------------


async def test_the_watch_yields_the_state_on_subscribing_then_every_grant_and_release(
    server: RedisServer, make_store: StoreFactory
) -> None:
    follower, leader = make_store(server.url), make_store(server.url)
    async with watching(follower) as seen:
        assert await asyncio.wait_for(seen.get(), 2) is None  # nothing stored yet
        granted = await leader.try_acquire("a_1", 5.0, 0, expected=None)
        record = await asyncio.wait_for(seen.get(), 1)
        assert record is not None
        assert (record.holder, record.term, record.duration) == ("a_1", granted.term, 5.0)
        assert stored_version(record.version) == stored_version(granted.version)
        renewed = await leader.renew("a_1", granted.term, 5.0)
        record = await asyncio.wait_for(seen.get(), 1)
        assert record is not None
        assert (record.holder, record.term) == ("a_1", granted.term)
        assert stored_version(record.version) == stored_version(renewed.version)
        await leader.release("a_1", granted.term)
        record = await asyncio.wait_for(seen.get(), 1)
        assert record is not None
        assert record.free
        assert record.released
        assert record.term == granted.term


async def test_the_watch_survives_a_server_restart_and_reports_the_state_it_finds(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A change while the watch was disconnected is not lost: on reconnecting the watch reads
    and yields the current state (here: nothing, the restart lost it), and it never raises
    meanwhile. The holder's renewal then puts its grant back with the same term, and the
    watch reports it under a new epoch: a version seen before the reconnect is never taken
    for the same record again."""
    follower, leader = make_store(server.url), make_store(server.url)
    granted = await leader.try_acquire("a_1", 30.0, 0, expected=None)
    async with watching(follower) as seen:
        first = await asyncio.wait_for(seen.get(), 2)
        assert first is not None
        assert first.holder == "a_1"
        server.stop()
        await asyncio.sleep(0.5)  # the watch retries against a dead server meanwhile
        server.restart()  # empty: the lease (and its term) are gone
        assert await next_matching(seen, lambda r: r is None, timeout=5) is None
        restored = await leader.renew("a_1", granted.term, 30.0)
        assert (restored.holder, restored.term) == ("a_1", granted.term)
        record = await next_matching(seen, lambda r: r is not None, timeout=2)
        assert record is not None
        assert (record.holder, record.term) == ("a_1", granted.term)
        assert stored_version(record.version) == stored_version(restored.version)
        assert record.version.rpartition("~")[2] != first.version.rpartition("~")[2]


async def test_follow_calls_with_the_state_on_subscribing_then_every_change_in_order(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """`follow` (issue 24): the records the watch yields, as calls and without a task per
    lease. After a server restart it reads and hands on what it finds; once stopped, nothing
    more."""
    follower, leader = make_store(server.url), make_store(server.url)
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
    stop = follower.follow(seen.put_nowait)
    try:
        assert await asyncio.wait_for(seen.get(), 2) is None  # nothing stored yet
        granted = await leader.try_acquire("a_1", 30.0, 0, expected=None)
        record = await asyncio.wait_for(seen.get(), 1)
        assert record is not None
        assert stored_version(record.version) == stored_version(granted.version)
        renewed = await leader.renew("a_1", granted.term, 30.0)
        record = await asyncio.wait_for(seen.get(), 1)
        assert record is not None
        assert stored_version(record.version) == stored_version(renewed.version)
        with server.client() as client:
            client.publish(CHANNEL, "not a record")
        record = await asyncio.wait_for(seen.get(), 2)  # as the watch yields it: unreadable
        assert record is not None
        assert record.unreadable is not None
        server.stop()
        await asyncio.sleep(0.5)
        server.restart()  # empty: the lease is gone
        assert await next_matching(seen, lambda r: r is None, timeout=5) is None
        restored = await leader.renew("a_1", granted.term, 30.0)
        record = await next_matching(seen, lambda r: r is not None, timeout=2)
        assert record is not None
        assert stored_version(record.version) == stored_version(restored.version)
    finally:
        stop()
    await leader.release("a_1", granted.term)
    await asyncio.sleep(0.3)
    assert seen.empty()


# -- durability: WAIT -----------------------------------------------------------------------


@pytest.fixture
def replica(tmp_path: Path, server: RedisServer) -> RedisServer:
    (tmp_path / "replica").mkdir()
    started = RedisServer.start(tmp_path / "replica")
    started.replicate(server)
    yield started  # type: ignore[misc]
    started.stop()


async def test_with_min_replicas_a_grant_counts_once_the_replica_has_it(
    server: RedisServer, replica: RedisServer, make_store: StoreFactory
) -> None:
    store = make_store(server.url, min_replicas=1)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    with replica.client() as client:  # acknowledged means: already on the replica
        assert json.loads(client.get(HOLDER))["term"] == granted.term
    renewed = await store.renew("a_1", granted.term, 5.0)
    assert renewed.version != granted.version


async def test_with_min_replicas_and_the_replica_stopped_acquire_fails_closed(
    server: RedisServer, replica: RedisServer, make_store: StoreFactory
) -> None:
    """The grant was written but no replica has it: it does not count, it is withdrawn (a
    released record, free at once, since nobody led with it) so no one appears to hold the
    lease, and its term stays used up."""
    store = make_store(server.url, min_replicas=1, request_timeout=0.4)
    replica.stop()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="only 0 of 1 replica") as refused:
        await store.try_acquire("a_1", 5.0, 0, expected=None)
    assert time.monotonic() - started < 0.4 + 0.3
    assert "withdrawn" in str(refused.value)
    record = await store.read()
    assert record is not None
    assert (record.holder, record.term, record.released) == (None, 1, True)
    replica.restart()
    replica.replicate(server)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=record.version)
    assert granted.term == 2


async def test_with_min_replicas_and_the_replica_stopped_renew_fails_closed(
    server: RedisServer, replica: RedisServer, make_store: StoreFactory
) -> None:
    store = make_store(server.url, min_replicas=1, request_timeout=0.4)
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    replica.pause()
    try:
        with pytest.raises(StoreUnavailable, match=r"only 0 of 1 replica.*renew"):
            await store.renew("a_1", granted.term, 5.0)
    finally:
        replica.resume()
    renewed = await store.renew("a_1", granted.term, 5.0)
    assert renewed.term == granted.term


async def test_with_min_replicas_and_the_replica_stopped_a_batch_fails_closed(
    server: RedisServer, replica: RedisServer, make_store: StoreFactory
) -> None:
    """A batch's renewals count only once a replica has them, all of them: too few
    acknowledgements and the whole batch is unavailability, so no lease's deadline moves."""
    store = make_store(server.url, min_replicas=1, request_timeout=0.4)
    other = make_store(server.url, lease="u", min_replicas=1, request_timeout=0.4)
    grants = [await s.try_acquire("a_1", 5.0, 0, expected=None) for s in (store, other)]
    batch = [Renewal(name, "a_1", g.term, 5.0) for name, g in zip("tu", grants, strict=True)]
    replica.pause()
    try:
        with pytest.raises(StoreUnavailable, match=r"only 0 of 1 replica.*batch of 2"):
            await store.client.renew_many(batch)
    finally:
        replica.resume()
    outcomes = await store.client.renew_many(batch)
    assert [o.term for o in outcomes if isinstance(o, LeaseRecord)] == [g.term for g in grants]


async def test_wait_counts_the_writes_of_the_request_itself(
    server: RedisServer, replica: RedisServer, make_store: StoreFactory
) -> None:
    """A grant that finds the lease held writes nothing and does not wait for replicas."""
    holder = make_store(server.url, min_replicas=1, request_timeout=0.6)
    await holder.try_acquire("a_1", 30.0, 0, expected=None)
    replica.pause()
    try:
        other = make_store(server.url, min_replicas=1, request_timeout=0.6)
        started = time.monotonic()
        with pytest.raises(LeaseHeld):
            await other.try_acquire("b_1", 30.0, 0, expected=None)
        assert time.monotonic() - started < 0.2
    finally:
        replica.resume()


# -- least privilege ------------------------------------------------------------------------


def documented_acl() -> str:
    """The ACL docs/redis.md recommends, read from the page itself (password: ``pw``), so the
    page and this test cannot drift apart."""
    prefix = "ACL SETUSER sidecar "
    page = REPO / "docs" / "redis.md"
    (line,) = [line for line in page.read_text().splitlines() if line.startswith(prefix)]
    return line.removeprefix(prefix).replace(">PASSWORD", ">pw")


async def test_the_documented_acl_is_enough_for_every_operation(
    tmp_path: Path, server: RedisServer, make_store: StoreFactory
) -> None:
    (tmp_path / "replica").mkdir()
    replica = RedisServer.start(tmp_path / "replica")
    try:
        replica.replicate(server)
        with server.client() as client:
            client.execute_command("ACL", "SETUSER", "sidecar", *documented_acl().split())
            client.script_flush()  # the scripts must be loadable by this user too
        url = f"redis://sidecar:pw@127.0.0.1:{server.port}/0"
        store, follower = make_store(url, min_replicas=1), make_store(url)
        async with watching(follower) as seen:
            assert await asyncio.wait_for(seen.get(), 2) is None
            granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
            await store.renew("a_1", granted.term, 5.0)
            (renewed,) = await store.client.renew_many([Renewal("t", "a_1", granted.term, 5.0)])
            assert isinstance(renewed, LeaseRecord)
            await store.release("a_1", granted.term)
            released = await next_matching(seen, lambda r: r is not None and r.free, 2)
            assert released is not None
            assert released.term == granted.term
        with server.client() as client:
            assert client.execute_command("ACL", "LOG") == []  # nothing was refused
    finally:
        replica.stop()


async def test_a_pubsub_hub_that_fails_comes_back_under_its_supervisor(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """The hub rides out what the connection does; a failure of its own (a bug, here as it
    opens a connection) ends the task, and the supervisor starts it again: the watch goes on
    and reports the next grant (issue 25)."""
    follower, leader = make_store(server.url), make_store(server.url)
    client = follower.client
    client.supervisor.backoff = (0.05, 0.05)
    async with watching(follower) as seen:
        assert await asyncio.wait_for(seen.get(), 2) is None
    # Nobody watches: the hub closes its connection, and opens one for the next watch.
    channel = lease_keys("t")[2]
    async with asyncio.timeout(5):
        while client.hub.subscribed(channel):  # noqa: ASYNC110 (a poll on purpose)
            await asyncio.sleep(0.01)
    opens = client.redis.pubsub

    def broken_once() -> object:
        client.redis.pubsub = opens  # type: ignore[method-assign]
        raise RuntimeError("broken on purpose")

    client.redis.pubsub = broken_once  # type: ignore[method-assign]
    async with watching(follower) as seen:
        assert await asyncio.wait_for(seen.get(), 5) is None
        assert client.supervisor.failures["redis-pubsub"] == 1
        granted = await leader.try_acquire("a_1", 5.0, 0, expected=None)
        record = await next_matching(seen, lambda r: r is not None, timeout=5)
        assert record is not None
        assert (record.holder, record.term) == ("a_1", granted.term)
    assert client.supervisor.down() == {}


# -- issue 25: what a hand or another client wrote into our keys --------------------------------

POISONED_VALUES = {
    "not-utf8": b"\xff\xfe{",
    "term-text": json.dumps({"holder": "x_1", "term": "abc", "duration_ms": 5000, "version": "v"}),
    "term-2^63": '{"holder": "x_1", "term": 9223372036854775807, "duration_ms": 5000, '
    '"version": "v"}',
    "holder-escape": json.dumps(
        {"holder": "x\u001b[2J", "term": 3, "duration_ms": 5000, "version": "v"}
    ),
    "version-table": json.dumps({"holder": 7, "term": 3, "duration_ms": 5000, "version": {}}),
    "json-array": "[1, 2, 3]",
}


@pytest.mark.parametrize("poison", POISONED_VALUES, ids=list(POISONED_VALUES))
async def test_a_poisoned_value_is_unknown_and_taken_over_only_over_exactly_it(
    server: RedisServer, make_store: StoreFactory, poison: str
) -> None:
    """Whatever our key holds — bytes that are not UTF-8, a term of the wrong type or past
    what the scripts hold, no version — it reads as a record of unknown holder (never an
    error, never free), the watch reports it and goes on, and a grant goes only over that
    value, with a term the store holds (Python and the scripts name it alike)."""
    store = make_store(server.url)
    async with watching(store) as seen:
        assert await asyncio.wait_for(seen.get(), 2) is None
        with server.client() as client:
            client.set(HOLDER, POISONED_VALUES[poison])
            client.publish(lease_keys("t")[2], POISONED_VALUES[poison])  # a writer says so
        published = await asyncio.wait_for(seen.get(), 2)
        assert published is not None
        found = await store.read()
        assert found is not None
        assert found.unreadable is not None
        assert (found.holder, found.term, found.free, found.forgotten) == (None, 0, False, False)
        assert stored_version(published.version) == stored_version(found.version)
        with pytest.raises(LeaseHeld):
            await store.try_acquire("a_1", 5.0, 0, expected=None)
        taken = await store.try_acquire("a_1", 5.0, 1000, expected=found.version)
        assert (taken.holder, taken.term, taken.unreadable) == ("a_1", 1001, None)
        record = await next_matching(seen, lambda r: r is not None and r.holder == "a_1", 2)
        assert record is not None
        with server.client() as client:
            client.set(HOLDER, POISONED_VALUES[poison])
        with pytest.raises(NotOwned):  # nobody can renew or put back what it cannot read
            await store.renew("a_1", taken.term, 5.0)


async def test_a_value_without_a_version_of_ours_is_named_by_its_digest(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Versions are tokens this code writes; where there is none (or not text), the scripts
    and the decoding name the value by the same digest, so a grant stays conditional."""
    with server.client() as client:
        client.set(HOLDER, json.dumps({"holder": "x_1", "term": 3, "duration_ms": 5000}))
    store = make_store(server.url)
    found = await store.read()
    assert found is not None
    assert (found.holder, found.term, found.unreadable) == ("x_1", 3, None)
    assert stored_version(found.version).startswith("raw.")
    taken = await store.try_acquire("a_1", 5.0, 3, expected=found.version)
    assert (taken.holder, taken.term) == ("a_1", 4)


async def test_a_term_counter_nobody_can_read_is_unknown_not_an_error(
    server: RedisServer, make_store: StoreFactory
) -> None:
    with server.client() as client:
        client.set(lease_keys("t")[1], "abc")
    store = make_store(server.url)
    found = await store.read()
    assert found is not None
    assert found.unreadable is not None
    taken = await store.try_acquire("a_1", 5.0, 7, expected=found.version)
    assert taken.term == 8


async def test_no_grant_passes_the_highest_term_the_scripts_hold(
    server: RedisServer, make_store: StoreFactory
) -> None:
    from sidecar.backends.base import TermExhausted
    from sidecar.backends.records import MAX_TERM

    with server.client() as client:
        client.set(lease_keys("t")[1], str(MAX_TERM))
    store = make_store(server.url)
    found = await store.read()
    assert found is not None
    assert (found.term, found.unreadable) == (MAX_TERM, None)
    with pytest.raises(TermExhausted, match="refusing to grant"):
        await store.try_acquire("a_1", 5.0, 0, expected=found.version)
    with server.client() as client:
        assert client.get(lease_keys("t")[1]) == str(MAX_TERM)
        assert client.get(HOLDER) is None


async def test_candidate_values_nobody_can_read_are_left_out_not_the_whole_group(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """Issue 25: one bad value in the group's hash once failed every read of it."""
    from sidecar.backends.base import Candidate
    from sidecar.backends.redis import candidates_key

    group = make_store(server.url).client.candidates("jobs")
    await group.beat(Candidate("a_1", "11"), 5.0)
    with server.client() as client:
        key = candidates_key("jobs")
        client.hset(key, "x_1", "{not json")
        client.hset(key, "y_1", json.dumps({"version": "3", "priority": "abc"}))
        client.hset(key, b"z\xff", json.dumps({"version": "3"}))
    found = await group.list()
    assert sorted(c.identity for c in found if c.unreadable is None) == ["a_1"]
    assert len([c for c in found if c.unreadable is not None]) == 3
    await group.beat(Candidate("a_1", "12"), 5.0)  # the beat (and its collection) go on


async def test_a_follow_callback_that_raises_fails_the_hub_under_its_supervisor(
    server: RedisServer, make_store: StoreFactory
) -> None:
    """A callback that raises on a message is a bug, not a Redis outage (`FollowsByCall`): the
    pub/sub task fails under its supervisor (logged with its traceback, counted, restarted),
    and every follower of the client reads its record again on the new connection."""
    follower, leader = make_store(server.url), make_store(server.url)
    supervisor = Supervisor(backoff=(0.05, 0.1))
    follower.client.supervisor = supervisor
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
    others: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
    raised = []

    def call(record: LeaseRecord | None) -> None:
        if record is not None and not raised:
            raised.append(record)
            raise RuntimeError("a bug in the callback")
        seen.put_nowait(record)

    stops = [follower.follow(call), follower.client.lease("u").follow(others.put_nowait)]
    try:
        assert await asyncio.wait_for(seen.get(), 2) is None
        assert await asyncio.wait_for(others.get(), 2) is None
        granted = await leader.try_acquire("a_1", 30.0, 0, expected=None)
        record = await asyncio.wait_for(seen.get(), 3)  # read again after the restart
        assert record is not None
        assert stored_version(record.version) == stored_version(granted.version)
        assert raised
        assert supervisor.failures["redis-pubsub"] == 1
        assert await asyncio.wait_for(others.get(), 3) is None  # told anew too
        renewed = await leader.renew("a_1", granted.term, 30.0)
        record = await next_matching(seen, lambda r: r is not None, timeout=2)
        assert record is not None
        assert stored_version(record.version) == stored_version(renewed.version)
    finally:
        for stop in stops:
            stop()
    await leader.release("a_1", granted.term)
