"""The ZooKeeper store against real servers where the contract suite cannot reach: a session
the server expired, a member of the ensemble killed under a connected client, a digest
user's ACL, a URL's mistakes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from sidecar.backends.base import LeaseRecord, NotOwned, Renewal, StoreUnavailable
from sidecar.backends.zookeeper import client as zookeeper_client
from sidecar.backends.zookeeper import jute
from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.target import parse_target
from sidecar.config_error import ConfigError
from tests.zookeeper.servers import ensemble, fresh_chroot, shared_standalone

pytestmark = pytest.mark.slow
LEASE = 30.0


def close_session_from_elsewhere(endpoint: str, session_id: int, password: bytes) -> None:
    """Join the session from another connection and close it: the server forgets it, and the
    client that owned it is told "expired" when it next connects."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        body = struct.pack(">iqiq", 0, 0, 4000, session_id)
        body += struct.pack(">i", len(password)) + password + b"\0"
        sock.sendall(struct.pack(">i", len(body)) + body)
        sock.recv(4096)
        close = struct.pack(">ii", 1, -11)
        sock.sendall(struct.pack(">i", len(close)) + close)
        sock.recv(4096)


async def next_with_version(
    seen: asyncio.Queue[LeaseRecord | None], written: LeaseRecord, timeout: float
) -> None:
    """Until a record of ``written``'s stored version arrives (the epoch may differ)."""
    stored = written.version.rpartition("~")[0]
    deadline = time.monotonic() + timeout
    while True:
        record = await asyncio.wait_for(seen.get(), max(0.01, deadline - time.monotonic()))
        if record is not None and record.version.rpartition("~")[0] == stored:
            return


async def test_an_expired_session_is_replaced_and_its_watch_armed_again() -> None:
    """Expiry loses every watch: the client starts a new session at once, arms the watch
    before it reads again, and its follower sees the next write; what it saw before is timed
    anew (a new epoch in every version)."""
    server = shared_standalone()
    url = server.url(fresh_chroot("expiry"))
    follower = ZooKeeperStoreClient(parse_target(url), request_timeout=5.0)
    writer = ZooKeeperStoreClient(parse_target(url), request_timeout=5.0)
    try:
        lease = follower.lease("l")
        granted = await writer.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
        seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop = lease.follow(seen.put_nowait)
        await next_with_version(seen, granted, 5.0)
        before = follower.session.session_id
        close_session_from_elsewhere(server.endpoint, before, follower.session.password)
        deadline = time.monotonic() + 5.0
        while follower.session.sessions < 2 or not follower.watching:
            assert time.monotonic() < deadline, "no new session with its watch"
            await asyncio.sleep(0.01)
        assert follower.session.session_id != before
        assert follower.epoch == 1
        renewed = await writer.lease("l").renew("a_1", granted.term, LEASE)
        await next_with_version(seen, renewed, 2.0)
        stop()
    finally:
        await follower.close()
        await writer.close()


async def test_a_killed_member_costs_a_reconnect_and_no_change_goes_unseen() -> None:
    """A client whose member dies connects to another one, arms its watch there, and reads
    again: a renewal made meanwhile reaches its follower."""
    with ensemble() as members:
        url = members.url(fresh_chroot("member"))
        follower = ZooKeeperStoreClient(parse_target(url), request_timeout=2.0)
        writer = ZooKeeperStoreClient(parse_target(url), request_timeout=2.0)
        try:
            granted = await writer.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
            seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
            stop = follower.lease("l").follow(seen.put_nowait)
            await next_with_version(seen, granted, 5.0)
            assert follower.session.server is not None
            port = follower.session.server[1]
            victim = next(m for m in members.members if m.client_port == port)
            victim.kill()
            renewed = None
            deadline = time.monotonic() + 15.0
            while renewed is None:
                try:
                    renewed = await writer.lease("l").renew("a_1", granted.term, LEASE)
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "the ensemble never answered again"
            await next_with_version(seen, renewed, 10.0)
            assert follower.session.connections >= 2
            stop()
        finally:
            await follower.close()
            await writer.close()


async def test_a_digest_users_lease_is_closed_to_a_client_without_its_password() -> None:
    """The znodes a digest user creates are readable and writable by that user alone: a
    client without credentials, or with a wrong password, reads and writes nothing there and
    is told so as an unavailable store (never a record of no holder)."""
    base = shared_standalone().url(fresh_chroot("acl"))
    owner = ZooKeeperStoreClient(
        parse_target(base.replace("zookeeper://", "zookeeper://app:right-password@")),
        request_timeout=5.0,
    )
    strangers = [
        ZooKeeperStoreClient(parse_target(base), request_timeout=5.0),
        ZooKeeperStoreClient(
            parse_target(base.replace("zookeeper://", "zookeeper://app:wrong-password@")),
            request_timeout=5.0,
        ),
    ]
    try:
        granted = await owner.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
        for stranger in strangers:
            with pytest.raises(StoreUnavailable, match="not authorised"):
                await stranger.lease("l").read()
            with pytest.raises(StoreUnavailable, match="not authorised"):
                await stranger.lease("other").try_acquire("b_1", LEASE, 0, expected=None)
        assert await owner.lease("l").read() == granted
    finally:
        for client in (owner, *strangers):
            await client.close()


@pytest.mark.parametrize(
    ("url", "hosts", "chroot"),
    [
        (
            "zookeeper://zk1:2181,zk2,[::1]:2182/team/a",
            (("zk1", 2181), ("zk2", 2181), ("::1", 2182)),
            "/team/a",
        ),
        ("zookeeper://zk1", (("zk1", 2181),), "/leader-sidecar"),
    ],
)
def test_a_url_names_the_servers_and_the_chroot(
    url: str, hosts: tuple[tuple[str, int], ...], chroot: str
) -> None:
    target = parse_target(url)
    assert (target.hosts, target.chroot) == (hosts, chroot)


@pytest.mark.parametrize(
    "url",
    [
        "zookeeper://zk1:0",
        "zookeeper://zk1/a/../b",
        "zookeeper://:pw@zk1",
        "zk://zk1",
        "zookeeper://zk1/?x=1",
    ],
)
def test_a_bad_url_names_the_setting(url: str) -> None:
    with pytest.raises(ConfigError, match="--store"):
        parse_target(url)


def test_the_password_is_not_shown() -> None:
    target = parse_target("zookeeper://app:s3cret@zk1/x")
    assert target.digest == b"app:s3cret"
    assert "s3cret" not in target.describe()


async def test_a_batch_whose_multi_fails_gives_each_lease_its_own_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``multi`` is all or nothing and tells which ``setData`` failed first: that lease
    answers as its own ``renew`` would, and the others go again in the next ``multi`` (two
    leases taken over under the batch: three ``multi``s). A ``multi`` stays under its size
    limit: a small limit splits the batch, and every lease still renews once."""
    server = shared_standalone()
    url = server.url(fresh_chroot("batch"))
    client = ZooKeeperStoreClient(parse_target(url), request_timeout=5.0)
    other = ZooKeeperStoreClient(parse_target(url), request_timeout=5.0)
    try:
        names = [f"l{i}" for i in range(6)]
        grants = [await client.lease(n).try_acquire("a_1", LEASE, 0, expected=None) for n in names]
        stolen = {
            i: await other.lease(names[i]).try_acquire("b_1", LEASE, 0, expected=grants[i].version)
            for i in (2, 4)
        }
        calls: list[int] = []
        multi = client.multi

        async def counted(what: str, ops: list[tuple[int, jute.Writer]]) -> list[jute.MultiResult]:
            calls.append(len(ops))
            return await multi(what, ops)

        monkeypatch.setattr(client, "multi", counted)
        renewals = [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
        outcomes = await client.renew_many(renewals)
        assert calls == [6, 5, 4]
        for index, outcome in enumerate(outcomes):
            if index in stolen:
                assert isinstance(outcome, NotOwned), outcome
                assert outcome.record is not None
                assert (outcome.record.holder, outcome.record.term) == ("b_1", stolen[index].term)
            else:
                assert isinstance(outcome, LeaseRecord), outcome
                assert (outcome.holder, outcome.term) == ("a_1", grants[index].term)
                assert outcome.version != grants[index].version
        for index, taken in stolen.items():
            after = await other.lease(names[index]).read()
            assert after is not None
            assert after.version == taken.version

        calls.clear()
        monkeypatch.setattr(zookeeper_client, "MAX_MULTI_BYTES", 600)
        kept = [renewal for index, renewal in enumerate(renewals) if index not in stolen]
        again = await client.renew_many(kept)
        assert all(isinstance(outcome, LeaseRecord) for outcome in again), again
        assert len(calls) > 1
        assert sum(calls) == len(kept)
    finally:
        await client.close()
        await other.close()
