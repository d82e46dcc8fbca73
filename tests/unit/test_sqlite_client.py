"""The SQLite client shares one connection, one thread and one poller among its leases (issue
11), migrates files written before it, and garbage-collects silent candidates."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sidecar.backends.base import Candidate, LeaseRecord, LeaseStore, StoreUnavailable
from sidecar.backends.sqlite import SQLiteStoreClient
from sidecar.backends.sqlite.watch import WatchHub
from sidecar.supervisor import Supervisor
from tests.support.tools import REPO

LEASE = 30.0


@contextlib.contextmanager
def traced_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every sqlite3 connection opened in the block, as the list of statements it ran."""
    logs: list[list[str]] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = real_connect(*args, **kwargs)
        log: list[str] = []
        logs.append(log)
        conn.set_trace_callback(log.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield logs


@contextlib.asynccontextmanager
async def watching_all(
    stores: list[LeaseStore],
) -> AsyncIterator[list[asyncio.Queue[LeaseRecord | None]]]:
    queues: list[asyncio.Queue[LeaseRecord | None]] = [asyncio.Queue() for _ in stores]

    async def follow(store: LeaseStore, queue: asyncio.Queue[LeaseRecord | None]) -> None:
        async for record in store.watch():
            await queue.put(record)

    tasks = [asyncio.create_task(follow(s, q)) for s, q in zip(stores, queues, strict=True)]
    try:
        yield queues
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def sqlite_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("sqlite")}


# A poll that finds the file changed: BEGIN, the SELECT of what changed, the copy's UPDATE (only
# when something did), COMMIT.
TICK_STATEMENTS = 4


def poll_ticks(log: list[str]) -> list[list[str]]:
    """The statements of each poll, split at each ``PRAGMA data_version``."""
    ticks: list[list[str]] = []
    for statement in log:
        if "data_version" in statement:
            ticks.append([])
        elif ticks:
            ticks[-1].append(statement)
    return ticks


async def test_a_thousand_watched_leases_cost_one_connection_one_thread_and_one_poll_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "leases.db")
    threads_before = sqlite_threads()
    with traced_connections(monkeypatch) as logs:
        reader = SQLiteStoreClient(path, busy_timeout=5.0)
        writer = SQLiteStoreClient(path, busy_timeout=5.0)
        try:
            names = [f"lease-{i}" for i in range(1000)]
            async with watching_all([reader.lease(name) for name in names]) as queues:
                # Every watch yields once on start (no row yet: None).
                firsts = [await asyncio.wait_for(q.get(), timeout=10.0) for q in queues]
                assert firsts == [None] * 1000
                assert len(logs) == 1, "the reader opened more than one connection"
                assert len(sqlite_threads() - threads_before) == 1
                pollers = [t for t in asyncio.all_tasks() if t.get_name().startswith("sqlite-")]
                assert len(pollers) == 1
                # Starting a thousand watches read their rows in a few statements, not 1000.
                start_ticks = poll_ticks(logs[0])
                assert all(len(tick) <= TICK_STATEMENTS + 2 for tick in start_ticks)
                assert sum(len(tick) for tick in start_ticks) < 50

                logs[0].clear()
                granted = await writer.lease(names[500]).try_acquire("a_1", LEASE, 0, expected=None)
                while (record := await asyncio.wait_for(queues[500].get(), 5.0)) is None:
                    pass
                assert record.version == granted.version
                assert len(logs) == 2  # reader and writer: one connection each

                # One poll loop: each tick is one data_version read and, when the file
                # changed, one read transaction: a SELECT of the watched rows that differ
                # from the poller's copy (fanned out to the watches) and the copy's update.
                ticks = poll_ticks(logs[0])
                assert ticks
                assert all(len(tick) in (0, TICK_STATEMENTS - 1, TICK_STATEMENTS) for tick in ticks)
                changed = [tick for tick in ticks if len(tick) == TICK_STATEMENTS]
                assert 1 <= len(changed) <= 3
                assert all(any("UPDATE temp.sidecar_watched" in s for s in t) for t in changed)
                assert [i for i, q in enumerate(queues) if not q.empty()] == []
        finally:
            await reader.close()
            await writer.close()


async def test_a_watch_sees_a_write_made_through_another_lease_object_of_the_same_client(
    tmp_path: Path,
) -> None:
    """``data_version`` ignores the connection's own commits; the poller must not."""
    client = SQLiteStoreClient(str(tmp_path / "leases.db"), busy_timeout=5.0)
    try:
        async with watching_all([client.lease("x")]) as (seen,):
            assert await asyncio.wait_for(seen.get(), 5.0) is None
            granted = await client.lease("x").try_acquire("a_1", LEASE, 0, expected=None)
            record = await asyncio.wait_for(seen.get(), 5.0)
            assert record is not None
            assert record.version == granted.version
    finally:
        await client.close()


async def test_a_watch_yields_none_when_its_row_is_deleted(tmp_path: Path) -> None:
    reader = SQLiteStoreClient(str(tmp_path / "leases.db"), busy_timeout=5.0)
    writer = SQLiteStoreClient(str(tmp_path / "leases.db"), busy_timeout=5.0)
    try:
        await writer.lease("x").try_acquire("a_1", LEASE, 0, expected=None)
        async with watching_all([reader.lease("x")]) as (seen,):
            first = await asyncio.wait_for(seen.get(), 5.0)
            assert first is not None
            assert first.holder == "a_1"
            await asyncio.to_thread(writer.lease("x").delete_everything)
            assert await asyncio.wait_for(seen.get(), 5.0) is None
    finally:
        await reader.close()
        await writer.close()


async def test_closing_a_lease_ends_its_watch_and_the_last_watch_stops_the_poller(
    tmp_path: Path,
) -> None:
    client = SQLiteStoreClient(str(tmp_path / "leases.db"), busy_timeout=5.0)
    try:
        lease = client.lease("x")
        records = lease.watch()
        assert await asyncio.wait_for(anext(records), 5.0) is None
        assert client.hub.polling
        await lease.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(records), 5.0)
        await asyncio.sleep(0.2)  # the loop notices at its next tick
        assert not client.hub.polling
    finally:
        await client.close()


async def test_follow_calls_with_only_the_rows_that_changed_and_stops_when_told(
    tmp_path: Path,
) -> None:
    """`follow` (issue 24): the records a watch would yield, as calls, without a task per
    lease; a hand edit that leaves the version as it was is still seen; the copy the poller
    compares against is brought up to date, so an unchanged row is never handed on again."""
    path = tmp_path / "leases.db"
    reader = SQLiteStoreClient(str(path), busy_timeout=5.0)
    writer = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        calls: dict[str, asyncio.Queue[LeaseRecord | None]] = {n: asyncio.Queue() for n in "xyz"}
        stops = [reader.lease(n).follow(calls[n].put_nowait) for n in "xyz"]
        assert [await asyncio.wait_for(calls[n].get(), 5.0) for n in "xyz"] == [None] * 3
        granted = await writer.lease("y").try_acquire("a_1", LEASE, 0, expected=None)
        assert await asyncio.wait_for(calls["y"].get(), 5.0) == granted
        conn = sqlite3.connect(path)
        with conn:
            conn.execute("UPDATE leases SET renewed_at = 'by hand' WHERE name = 'y'")
        conn.close()
        edited = await asyncio.wait_for(calls["y"].get(), 5.0)
        assert edited is not None
        assert (edited.version, edited.ignored is not None) == (granted.version, True)
        await writer.lease("z").try_acquire("a_1", LEASE, 0, expected=None)
        assert (await asyncio.wait_for(calls["z"].get(), 5.0)) is not None
        await asyncio.sleep(0.3)  # several polls: nothing else changed, nothing is called
        assert [calls[n].qsize() for n in "xyz"] == [0, 0, 0]
        stops[2]()
        await writer.lease("z").release("a_1", 1)
        await writer.lease("x").try_acquire("a_1", LEASE, 0, expected=None)
        assert (await asyncio.wait_for(calls["x"].get(), 5.0)) is not None
        assert calls["z"].empty()
        for stop in stops[:2]:
            stop()
        await asyncio.sleep(0.2)  # the loop notices at its next tick
        assert not reader.hub.polling
    finally:
        await reader.close()
        await writer.close()


async def _next(calls: asyncio.Queue[LeaseRecord | None]) -> LeaseRecord | None:
    return await asyncio.wait_for(calls.get(), 5.0)


async def test_a_follow_callback_that_raises_restarts_the_poller_and_every_follower_is_told_anew(
    tmp_path: Path,
) -> None:
    """A callback that raises is a bug (`FollowsByCall`): the poller fails under its supervisor
    (counted), and every follower is told its record anew — those whose rows the failed look
    read but never handed on included — and changes keep coming after."""
    path = tmp_path / "leases.db"
    supervisor = Supervisor(backoff=(0.05, 0.1))
    reader = SQLiteStoreClient(str(path), busy_timeout=5.0, supervisor=supervisor)
    writer = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        calls: dict[str, asyncio.Queue[LeaseRecord | None]] = {n: asyncio.Queue() for n in "xy"}
        raised: list[LeaseRecord] = []

        def x(record: LeaseRecord | None) -> None:
            if record is not None and not raised:
                raised.append(record)
                raise RuntimeError("a bug in the callback")
            calls["x"].put_nowait(record)

        stops = [reader.lease("x").follow(x), reader.lease("y").follow(calls["y"].put_nowait)]
        assert [await _next(calls["x"]), await _next(calls["y"])] == [None, None]
        conn = sqlite3.connect(path)
        with conn:  # both rows in one commit: one look reads them both
            conn.execute(
                "INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version) "
                "VALUES ('x', 'a_1', 1, 30, 0, 'b', 1), ('y', 'a_1', 1, 30, 0, 'b', 2)"
            )
        conn.close()
        x_record, y_record = await _next(calls["x"]), await _next(calls["y"])
        assert raised == [x_record]
        assert y_record is not None
        assert y_record.version == "2"
        assert supervisor.failures["sqlite-watch"] == 1
        renewed = await writer.lease("y").renew("a_1", 1, LEASE)
        while (record := await _next(calls["y"])) != renewed:
            assert record == y_record  # (told anew after the restart, at most)
        for stop in stops:
            stop()
    finally:
        await reader.close()
        await writer.close()


async def test_a_follow_started_or_restarted_while_a_look_is_out_is_told_its_record(
    tmp_path: Path,
) -> None:
    """A follower that starts while the poller's look is out (here: queued behind a slow
    statement), or that stops and starts again with nothing changed, is told the record — and
    the followers already there are told the change the look found."""
    path = tmp_path / "leases.db"
    reader = SQLiteStoreClient(str(path), busy_timeout=5.0)
    writer = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        granted = await writer.lease("x").try_acquire("a_1", LEASE, 0, expected=None)
        first: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop_first = reader.lease("x").follow(first.put_nowait)
        assert await _next(first) == granted
        gate = threading.Event()
        slow = asyncio.ensure_future(reader.connection.run(lambda _conn: gate.wait(5.0)))
        await asyncio.sleep(0.15)  # the poller's next look waits behind it
        renewed = await writer.lease("x").renew("a_1", granted.term, LEASE)
        second: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop_second = reader.lease("x").follow(second.put_nowait)
        gate.set()
        await slow
        assert await _next(second) == renewed
        assert await _next(first) == renewed
        for _ in range(3):  # stop and start again, the row unchanged
            stop_second()
            second = asyncio.Queue()
            stop_second = reader.lease("x").follow(second.put_nowait)
            assert await _next(second) == renewed
            await asyncio.sleep(0.07)
        stop_first()
        stop_second()
        await asyncio.sleep(0.1)  # the poller stops, the copy still holds the row
        third: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop_third = reader.lease("x").follow(third.put_nowait)
        assert await _next(third) == renewed
        stop_third()
        assert first.empty()
    finally:
        await reader.close()
        await writer.close()


async def test_the_poller_wakes_only_when_the_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection's thread reads ``data_version`` between its jobs and wakes the poller
    only when it moved (or this client wrote): while nothing changes, no look at all."""
    path = tmp_path / "leases.db"
    reader = SQLiteStoreClient(str(path), busy_timeout=5.0)
    writer = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop = reader.lease("x").follow(seen.put_nowait)
        assert await asyncio.wait_for(seen.get(), 5.0) is None
        await asyncio.sleep(0.2)  # the first looks are over
        looks = 0
        real_look = reader.hub._look

        async def look(*args: Any) -> Any:
            nonlocal looks
            looks += 1
            return await real_look(*args)

        monkeypatch.setattr(reader.hub, "_look", look)
        await asyncio.sleep(0.5)  # ten intervals, nothing written
        assert looks == 0
        granted = await writer.lease("x").try_acquire("a_1", LEASE, 0, expected=None)
        assert await asyncio.wait_for(seen.get(), 5.0) == granted
        assert looks >= 1
        stop()
    finally:
        await reader.close()
        await writer.close()


async def test_a_look_that_fails_is_logged_and_every_follower_is_told_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A look the store refuses is retried — and said: a failure of the poller's own
    statements leaves every follower deaf to the others while the electors' own requests may
    all succeed."""
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0, watch_interval=0.01)
    try:
        told: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop = client.lease("x").follow(told.put_nowait)
        assert await _next(told) is None
        real = WatchHub._look
        failures = [3]

        async def look(hub: WatchHub, *args: Any) -> tuple[int, int]:
            if failures[0]:
                failures[0] -= 1
                raise StoreUnavailable("sqlite leases.db: disk I/O error")
            return await real(hub, *args)

        monkeypatch.setattr(WatchHub, "_look", look)
        with caplog.at_level(logging.WARNING, logger="sidecar.sqlite"):
            writer = SQLiteStoreClient(str(path), busy_timeout=5.0)
            await writer.lease("y").try_acquire("a_1", LEASE, 0, expected=None)  # a look
            await writer.close()
            assert await _next(told) is None  # told anew once it reads again
        lines = [r for r in caplog.records if r.name == "sidecar.sqlite"]
        assert len(lines) == 1  # (one line per 10 s)
        assert "cannot read the watched leases" in lines[0].getMessage()
        stop()
    finally:
        await client.close()


# Run in a mount namespace where /tmp and /var/tmp (SQLite's temporary directories) are
# read-only and the working directory is /var/tmp, as in the chart's pods
# (readOnlyRootFilesystem); the database is in a writable directory bound at /mnt.
_READ_ONLY_TEMP = (
    "mount --bind {data} /mnt && mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && "
    "mount --bind /var/tmp /var/tmp && mount -o remount,bind,ro /var/tmp && cd /var/tmp && "
    'exec "$0" -c "$1"'
)
_THREE_THOUSAND_FOLLOWERS = """
import asyncio
from sidecar.backends.sqlite import SQLiteStoreClient

async def main():
    client = SQLiteStoreClient("/mnt/leases.db", busy_timeout=5.0)
    told = asyncio.Queue()
    stops = [client.lease(f"l{i}").follow(told.put_nowait) for i in range(3000)]
    for _ in stops:
        await asyncio.wait_for(told.get(), 20.0)
    for stop in stops:
        stop()
    await client.close()
    print("every follower told")

asyncio.run(main())
"""


def test_the_watch_poller_needs_no_temporary_files_for_thousands_of_leases(
    tmp_path: Path,
) -> None:
    """The poller's copy of the watched rows, and what its statements build, stay in memory:
    from about 2,500 leases SQLite would otherwise put them in files under /var/tmp or /tmp,
    which a pod with a read-only root filesystem does not have, and every look failed."""
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount --bind /tmp /tmp"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    script = _READ_ONLY_TEMP.format(data=tmp_path)
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, _THREE_THOUSAND_FOLLOWERS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("TMPDIR", "SQLITE_TMPDIR")},
            "PYTHONPATH": str(REPO),
        },
    )
    assert "every follower told" in done.stdout, done.stderr[-2000:]


# The leases table as written before issue 11 (no successor column).
_OLD_SCHEMA = """
CREATE TABLE leases (
    name TEXT PRIMARY KEY, holder TEXT, term INTEGER NOT NULL, duration REAL NOT NULL,
    expires_at REAL NOT NULL, boot_id TEXT NOT NULL, version INTEGER NOT NULL,
    acquired_at TEXT, renewed_at TEXT
)
"""


async def test_a_file_from_before_issue_11_is_migrated_and_keeps_its_lease(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "leases.db")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_OLD_SCHEMA)
        conn.execute(
            "INSERT INTO leases VALUES ('default', 'a_1', 41, 30.0, 0, 'boot', 77, "
            "'2026-11-29T09:00:00+00:00', '2026-11-29T09:00:00+00:00')"
        )
    clients = [SQLiteStoreClient(path, busy_timeout=5.0) for _ in range(3)]
    try:
        # Several sidecars opening the old file together: one adds the column, none fails.
        records = await asyncio.gather(*(c.lease("default").read() for c in clients))
        for record in records:
            assert record is not None
            assert (record.holder, record.term, record.version) == ("a_1", 41, "77")
            assert record.successor is None
        released = await clients[0].lease("default").release("a_1", 41, successor="b_1")
        assert released is not None
        assert released.successor == "b_1"
        assert released.term == 41
        assert await clients[1].candidates("g").list() == []  # the table exists too
    finally:
        for client in clients:
            await client.close()


class SteppedClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.moment = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

    def now(self) -> float:
        return 0.0

    def wall(self) -> datetime:
        return self.moment


async def test_candidates_silent_for_twenty_leases_are_forgotten_by_the_next_beat(
    tmp_path: Path,
) -> None:
    clock = SteppedClock()
    client = SQLiteStoreClient(str(tmp_path / "leases.db"), clock=clock)
    try:
        group = client.candidates("g")
        await group.beat(Candidate("old_1", ""), 1.0)
        await group.beat(Candidate("quiet_1", ""), 1.0)
        clock.moment += timedelta(seconds=19)
        await group.beat(Candidate("quiet_1", ""), 1.0)
        clock.moment += timedelta(seconds=2)  # old_1 silent 21 leases, quiet_1 only 2
        await group.beat(Candidate("new_1", ""), 1.0)
        assert sorted(c.identity for c in await group.list()) == ["new_1", "quiet_1"]
    finally:
        await client.close()


async def test_a_renewal_goes_ahead_of_queued_work_on_the_connection(tmp_path: Path) -> None:
    """The one connection thread takes renewals and releases before the acquires, reads and
    polls queued ahead of them (1,000 leases taken at start-up must not make a held lease
    miss its deadline); among equals, arrival order. A caller that gave up is skipped."""
    from sidecar.backends.sqlite.connection import Connection
    from sidecar.clock import SYSTEM_CLOCK

    connection = Connection(str(tmp_path / "leases.db"), 5.0, SYSTEM_CLOCK)
    release_first = threading.Event()
    order: list[str] = []

    def blocked(conn: sqlite3.Connection) -> None:
        release_first.wait(5)
        order.append("first")

    def work(name: str) -> Any:
        return lambda conn: order.append(name)

    first = asyncio.create_task(connection.run(blocked))
    await asyncio.sleep(0.05)  # the thread is inside `blocked` now
    queued = [asyncio.create_task(connection.run(work(f"acquire-{i}"))) for i in range(3)]
    abandoned = asyncio.create_task(connection.run(work("abandoned")))
    renewal = asyncio.create_task(connection.run(work("renewal"), urgent=True))
    await asyncio.sleep(0.05)
    abandoned.cancel()
    release_first.set()
    await asyncio.gather(first, *queued, renewal)
    assert order == ["first", "renewal", "acquire-0", "acquire-1", "acquire-2"]
    await connection.close()


def test_a_writer_waiting_for_the_lock_tries_again_every_millisecond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not SQLite's own backoff (up to 100 ms between tries, so a waiting sidecar keeps losing
    the lock to the others): short, even retries, within the busy timeout, which is restored."""
    from sidecar.backends.sqlite import schema

    path = tmp_path / "leases.db"
    holder = sqlite3.connect(path, isolation_level=None, timeout=5, check_same_thread=False)
    waiter = sqlite3.connect(path, isolation_level=None, timeout=5)
    for conn in (holder, waiter):
        conn.execute("PRAGMA journal_mode=WAL")
    sleeps: list[float] = []
    real_sleep = schema.time.sleep
    monkeypatch.setattr(schema.time, "sleep", lambda s: (sleeps.append(s), real_sleep(s)))
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.05, lambda: holder.execute("COMMIT")).start()
    with schema.transaction(waiter):
        waiter.execute("CREATE TABLE IF NOT EXISTS t (x)")
    assert sleeps, "it never had to wait"
    assert set(sleeps) == {schema.LOCK_RETRY}
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (5000,)
    holder.close()
    waiter.close()
