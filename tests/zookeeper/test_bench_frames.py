"""The benchmark's ZooKeeper proxy (`benchmarks.zookeeper_frames`) against a real server: it
counts every request a client sends, records the writes the server answered, and finds a lock
recipe's holder and when its session was last heard from."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.zookeeper_frames import FrameProxies
from tests.zookeeper.servers import fresh_chroot, shared_standalone

pytestmark = pytest.mark.slow
kazoo_client = pytest.importorskip("kazoo.client")
kazoo_exceptions = pytest.importorskip("kazoo.exceptions")


@pytest.fixture
def proxies() -> Iterator[FrameProxies]:
    server = shared_standalone()
    started = FrameProxies(("127.0.0.1", server.client_port))
    try:
        yield started
    finally:
        started.close()


def connected(proxies: FrameProxies, slot: str) -> object:
    client = kazoo_client.KazooClient(hosts=proxies.endpoint(slot), timeout=4.0)
    client.start()
    return client


def test_each_request_is_counted_for_its_slot(proxies: FrameProxies) -> None:
    root = fresh_chroot("frames")
    client = connected(proxies, "a")
    try:
        client.ensure_path(root)
        before = proxies.ops("a")["getData"]
        for _ in range(20):
            client.get(root)
        assert proxies.ops("a")["getData"] - before == 20
        assert proxies.ops("a")["connect"] == 1
        assert proxies.requests("b") == 0
        assert proxies.requests("a") == sum(proxies.ops("a").values())
    finally:
        client.stop()
        client.close()


def test_answered_writes_are_the_store_record(proxies: FrameProxies) -> None:
    root = fresh_chroot("frames")
    client = connected(proxies, "a")
    try:
        client.create(root, b"0")
        sent = time.time()
        client.set(root, b"1")
        answered = time.time()
        with pytest.raises(kazoo_exceptions.BadVersionError):
            client.set(root, b"2", version=0)  # refused: not a write
        written = proxies.last_write(root, time.time())
        assert written is not None
        assert sent <= written <= answered
    finally:
        client.stop()
        client.close()


def last_sent(proxies: FrameProxies, slot: str, moment: float) -> float:
    return max(
        at for c in proxies.connections if c.slot == slot for at, _ in c.sent if at <= moment
    )


def test_the_lock_holder_is_the_lowest_live_znode(proxies: FrameProxies) -> None:
    parent = fresh_chroot("frames") + "/election"
    first, second = connected(proxies, "a"), connected(proxies, "b")
    try:
        first.create(parent + "/n-", ephemeral=True, sequence=True, makepath=True)
        second.create(parent + "/n-", ephemeral=True, sequence=True)
        first.get(parent)
        second.get(parent)  # the latest frame is the second's: the holder's is not that one
        now = time.time()
        assert proxies.holder_last_heard(parent, now) == last_sent(proxies, "a", now)
        assert last_sent(proxies, "a", now) < last_sent(proxies, "b", now)
        first.stop()  # its session closes, its znode goes: the second holds
        second.get(parent)
        now = time.time()
        assert proxies.holder_last_heard(parent, now) == last_sent(proxies, "b", now)
    finally:
        for client in (first, second):
            client.stop()
            client.close()


def test_the_hand_off_benchmark_connects_past_the_proxies(tmp_path: Path) -> None:
    """`benchmarks.handoffs` times a few milliseconds: its replicas reach ZooKeeper itself,
    not through a harness thread per frame; `benchmarks.run`'s go through and are counted."""
    from benchmarks.handoffs import STORES

    store_class, _ = STORES["zookeeper"]
    store = store_class(tmp_path)
    try:
        assert store.endpoint_for("ours-0") == store.server.endpoint
        client = kazoo_client.KazooClient(hosts=store.endpoint_for("ours-0"), timeout=4.0)
        client.start()
        try:
            client.get("/")
        finally:
            client.stop()
            client.close()
        assert store.frames.requests("ours-0") == 0
        with pytest.raises(RuntimeError):
            store.through_proxies()
        store.proxies = True  # as `benchmarks.run` makes it
        assert store.endpoint_for("ours-0") == store.frames.endpoint("ours-0")
        assert store.endpoint_for("ours-0-start") == store.server.endpoint
        assert store.through_proxies() is store.frames
    finally:
        store.close()
