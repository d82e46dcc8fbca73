"""A write by one process wakes the SQLite watch pollers of the others at once (`wake`), and
the poll stays when the wake-up directory cannot be used. Real processes, the real file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sidecar.backends.base import LeaseRecord
from sidecar.backends.sqlite import SQLiteLeaseStore
from sidecar.backends.sqlite.wake import wake_directory
from tests.support.tools import REPO

# A child process that takes the lease and renews it, then releases it when told (a line on
# stdin), and says when the release was done. (Only the renewal and the release, the writes
# someone waits for, are told of at once; the acquire is left to the poll.)
WRITER = """
import asyncio, sys, time
from sidecar.backends.sqlite import SQLiteLeaseStore

async def main():
    store = SQLiteLeaseStore(sys.argv[1], "wake")
    record = await store.try_acquire("child", 30.0, 0, expected=None)
    record = await store.renew("child", record.term, 30.0)
    print("held", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await store.release("child", record.term)
    print("released", time.monotonic(), flush=True)  # (the clock every process shares)
    await store.close()

asyncio.run(main())
"""


@contextlib.contextmanager
def writer(path: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


async def line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    return (await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)).strip()


def sockets_in(path: Path) -> list[str]:
    """The pids of the sockets in ``path``'s wake-up directory."""
    return sorted(name.split("-")[0] for name in os.listdir(wake_directory(str(path))))


def status(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "status", "--lease", "wake", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "LEADER_SIDECAR_STORE": f"sqlite:///{path}"},
    )


def make_stale_socket(path: Path) -> Path:
    """A socket file nobody is bound to, as a SIGKILLed process leaves it."""
    directory = Path(wake_directory(str(path)))
    directory.mkdir(mode=0o700)
    stale = directory / "999999-dead.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(stale))
    sock.close()
    return stale


seen_at: list[float] = []  # when each record reached the watch (`watching`)


@contextlib.asynccontextmanager
async def watching(
    path: Path, interval: float
) -> AsyncIterator[tuple[SQLiteLeaseStore, asyncio.Queue[LeaseRecord | None]]]:
    store = SQLiteLeaseStore(str(path), "wake", watch_interval=interval)
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()

    def arrived(record: LeaseRecord | None) -> None:
        seen_at.append(time.monotonic())
        seen.put_nowait(record)

    seen_at.clear()
    stop = store.follow(arrived)
    try:
        assert await asyncio.wait_for(seen.get(), 5) is None  # nobody holds it yet
        yield store, seen
    finally:
        stop()
        await store.close()


async def next_change(seen: asyncio.Queue[LeaseRecord | None], within: float) -> LeaseRecord:
    record = await asyncio.wait_for(seen.get(), within)
    assert record is not None
    return record


async def test_another_process_s_release_wakes_the_watch_long_before_its_poll(
    tmp_path: Path,
) -> None:
    """Polled every 5 s, the watch still sees another process's renewal and release within
    0.2 s of the write: the writer's datagram wakes the poller."""
    path = tmp_path / "leases.db"
    async with watching(path, interval=5.0) as (store, seen):
        assert sockets_in(path) == [str(os.getpid())]
        assert oct(os.stat(wake_directory(str(path))).st_mode & 0o777) == "0o700"
        with writer(path) as child:
            assert await line(child) == "held"
            held = await next_change(seen, within=4)
            assert held.holder == "child"
            assert held.version == (await store.read()).version  # the renewal's
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            released = await next_change(seen, within=4)
            assert released.holder is None
            assert released.released
            said, released_at = (await line(child)).split()
            assert said == "released"
            waited = seen_at[-1] - float(released_at)
            assert waited < 0.2, f"the release was seen {waited:.3f} s after it was written"
        assert store.client.hub.hints >= 2  # the renewal's and the release's
    # The watch ended: its socket is gone with it.
    assert sockets_in(path) == []


async def test_a_dead_process_s_socket_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    stale = make_stale_socket(path)
    async with watching(path, interval=1.0) as (store, _):
        assert sockets_in(path) == sorted([str(os.getpid()), "999999"])
        record = await store.try_acquire("me", 30.0, 0, expected=None)
        await store.renew("me", record.term, 30.0)
        notifier = store.client.connection.notifier
        assert notifier is not None
        for _ in range(100):  # the notice goes once the connection's queue is done
            if len(sockets_in(path)) == 1:
                break
            await asyncio.sleep(0.01)
        assert sockets_in(path) == [str(os.getpid())]
        assert stale.name not in os.listdir(stale.parent)
        assert notifier.sent == 1  # to the live socket (our own), not the dead one


async def test_a_status_read_creates_no_wake_up_directory(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    store = SQLiteLeaseStore(str(path), "wake")
    await store.try_acquire("me", 30.0, 0, expected=None)  # a file, no watch: no directory
    await store.close()
    done = await asyncio.to_thread(status, path)
    assert done.returncode == 0, done.stderr
    assert '"me"' in done.stdout
    # (SQLite's own -wal and -shm may appear beside the file)
    assert os.path.basename(wake_directory(str(path))) not in os.listdir(tmp_path)


async def test_an_unusable_wake_up_directory_leaves_the_poll_to_do_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file where the directory should be (as unusable as an unwritable directory, and so
    even for root): said once, and the watch still sees the other process's writes by
    polling."""
    path = tmp_path / "leases.db"
    os.close(os.open(wake_directory(str(path)), os.O_CREAT | os.O_WRONLY, 0o600))
    caplog.set_level(logging.INFO, logger="sidecar.sqlite")
    async with watching(path, interval=0.05) as (store, seen):
        with writer(path) as child:
            assert await line(child) == "held"
            assert (await next_change(seen, within=5)).holder == "child"
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert (await next_change(seen, within=5)).released
            assert (await line(child)).startswith("released")
        assert store.client.hub.hints == 0
    off = [r for r in caplog.records if "wake-ups are off" in r.getMessage()]
    assert len(off) == 1


async def test_a_path_too_long_for_a_socket_address_still_wakes(tmp_path: Path) -> None:
    """Past the kernel's 107 bytes the sockets are reached through ``/proc/self/fd``."""
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    await asyncio.to_thread(deep.mkdir, parents=True)
    path = deep / "leases.db"
    async with watching(path, interval=1.0) as (store, seen):
        other = SQLiteLeaseStore(str(path), "wake")  # another client: its own connection
        try:
            record = await other.try_acquire("other", 30.0, 0, expected=None)
            assert (await next_change(seen, within=2)).holder == "other"  # (polled)
            began = time.monotonic()
            renewed = await other.renew("other", record.term, 30.0)
            assert (await next_change(seen, within=0.9)).version == renewed.version
            assert time.monotonic() - began < 0.2
        finally:
            await other.close()
        assert store.client.hub.hints >= 1


async def test_a_write_told_at_once_is_not_looked_at_again_at_the_next_probe(
    tmp_path: Path,
) -> None:
    """The woken look reads the write; the probe, which times its own look, then finds
    nothing new in the file and leaves the poller asleep: one look per write, not two."""
    path = tmp_path / "leases.db"
    interval = 0.5
    async with watching(path, interval=interval) as (store, seen):
        other = SQLiteLeaseStore(str(path), "wake")  # another client: its own connection
        try:
            record = await other.try_acquire("other", 30.0, 0, expected=None)
            assert (await next_change(seen, within=interval * 3)).holder == "other"  # (polled)
            await asyncio.sleep(interval * 1.5)  # (the probe has seen it too)
            looks = store.client.hub.looks
            renewed = await other.renew("other", record.term, 30.0)
            assert (await next_change(seen, within=interval * 0.9)).version == renewed.version
            # Two probes' time: each would have woken the poller for a write it had not seen.
            await asyncio.sleep(interval * 2.5)
            assert store.client.hub.looks - looks == 1
            assert seen.empty()
        finally:
            await other.close()
        assert store.client.hub.hints == 1


async def test_wake_ups_never_put_the_poll_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of forged wake-ups, and looks made to rest as long as they may (a whole
    interval): a write nobody tells of is still seen within one interval of the look before
    it, as with no wake-ups at all. The poll is the fallback; a hint only brings a look
    forward."""
    monkeypatch.setattr("sidecar.backends.sqlite.watch.LOOK_SHARE_REST", 1e9)
    path = tmp_path / "leases.db"
    interval = 0.3
    directory = wake_directory(str(path))
    forger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    forger.setblocking(False)

    async def forge() -> None:
        while True:
            for name in os.listdir(directory):
                with contextlib.suppress(OSError):
                    forger.sendto(b"!", os.path.join(directory, name))
            await asyncio.sleep(0.02)

    async with watching(path, interval=interval) as (store, seen):
        other = SQLiteLeaseStore(str(path), "wake")
        forging = asyncio.create_task(forge())
        try:
            other.client.connection.notifier = None  # its writes are told of by nobody
            await asyncio.sleep(interval)  # the poller rests between forged wake-ups
            looks = store.client.hub.looks
            began = time.monotonic()
            await other.try_acquire("other", 30.0, 0, expected=None)
            assert (await next_change(seen, within=5)).holder == "other"
            waited = time.monotonic() - began
            # One interval at most, and the look's own time; two, were a rest added to it.
            assert waited < interval * 1.5, f"seen {waited:.3f} s after the write"
            assert store.client.hub.hints > 10
            assert store.client.hub.looks - looks <= 2 + int(waited / interval)
        finally:
            forging.cancel()
            forger.close()
            await other.close()


async def test_an_acquire_is_left_to_the_poll_a_renewal_is_told_at_once(tmp_path: Path) -> None:
    """Acquires come by the thousand at start-up: they wake nobody. A renewal, a release, a
    hand-over (what followers and a successor wait for) wake every watching process."""
    path = tmp_path / "leases.db"
    async with watching(path, interval=1.0):
        other = SQLiteLeaseStore(str(path), "wake")
        try:
            notifier = other.client.connection.notifier
            assert notifier is not None
            record = await other.try_acquire("other", 30.0, 0, expected=None)
            await other.client.connection.run(lambda conn: None)  # (after the acquire's job)
            assert notifier.sent == 0
            record = await other.renew("other", record.term, 30.0)
            await other.client.connection.run(lambda conn: None)
            assert notifier.sent == 1  # to our one socket
            await other.release("other", record.term)
            await other.client.connection.run(lambda conn: None)
            assert notifier.sent == 2
        finally:
            await other.close()
