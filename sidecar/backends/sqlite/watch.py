"""One change poller per client, fanned out to every lease watch of that client.

``PRAGMA data_version`` changes when another connection commits: a microsecond local read, so
polling it every interval sees every write within one interval. A thousand leases must not
mean a thousand such loops: one loop polls, and only when something changed asks SQLite for the
watched rows that differ from the copy it keeps of them (a table of this connection's own, in
its ``temp`` schema), so that only the rows that changed are read, decoded and handed on — a
batch of another replica's renewals is 333 rows of 1,000, a candidate beat none.

A watch (`kit.subscription.Subscription`) is either an async iterator (`SQLiteLease.watch`) or
a callback (`SQLiteLease.follow`, called on the poller's task as each changed row is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.kit.subscription import Subscription
from sidecar.backends.sqlite.connection import Connection
from sidecar.backends.sqlite.schema import (
    WATCHED,
    WATCHED_CHANGED,
    WATCHED_FORGET,
    WATCHED_NEW,
    WATCHED_SEEN,
    lease_record,
)
from sidecar.backends.sqlite.wake import Listener
from sidecar.logs import Throttle, log
from sidecar.supervisor import Supervisor

logger = logging.getLogger("sidecar.sqlite")

LOOK_SHARE_REST = 4.0  # a woken poller rests this many times its last look's CPU time


class WatchHub:
    """The client's one poller. It runs while at least one watch does."""

    def __init__(self, connection: Connection, interval: float, supervisor: Supervisor) -> None:
        self._connection = connection
        self._interval = interval
        self._supervisor = supervisor  # restarts the poller if it fails
        self._watches: dict[str, set[Subscription]] = {}
        self._fresh: set[str] = set()  # names with a watch not yet told its record
        self._gone: set[str] = set()  # names nobody watches any more, still in the copy
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # something changed, or a watch came or went: look
        self._copied_on: sqlite3.Connection | None = None  # the connection the copy is in
        self._failing = Throttle()  # a look that fails: one line per 10 s
        # Another process's word that it wrote (`wake`): look now, not at the next probe.
        self._listener = None if connection.read_only else Listener(connection.path)
        self.hints = 0  # wake-ups heard (tests count them)
        self.looks = 0  # looks at the file (tests count them)
        self._look_cpu = 0.0  # seconds of CPU the last look took, on the connection's thread

    @property
    def polling(self) -> bool:
        return self._task is not None

    def subscribe(
        self, name: str, callback: Callable[[LeaseRecord | None], None] | None = None
    ) -> Subscription:
        """A watch of ``name``: woken through its event, or (``callback``) calling it with
        every changed record, on the poller's task, until `unsubscribe`."""
        watch = Subscription(name, callback)
        self._watches.setdefault(name, set()).add(watch)
        self._fresh.add(name)
        self._gone.discard(name)
        self._wake.set()
        if self._task is None:
            self._task = self._supervisor.spawn("sqlite-watch", self._poll)
        return watch

    def unsubscribe(self, watch: Subscription) -> None:
        watches = self._watches.get(watch.name)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.name]
                self._gone.add(watch.name)
                self._wake.set()  # (the poller ends when nobody watches)
        watch.end()

    async def close(self) -> None:
        for watches in list(self._watches.values()):
            for watch in list(watches):
                self.unsubscribe(watch)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _poll(self) -> None:
        """Until no watch is left. Raises only on a bug (a callback that raised, say): the
        supervisor then starts it again (with ``_task`` still set, so that a new watch does not
        start a second poller), and every watch is told its record anew, as after a failure
        of the store: the copy may have moved past what was handed on."""
        data_version: int | None = None
        writes: int | None = None
        self._wake = wake = asyncio.Event()  # (of this loop)
        self._restart_all()
        loop = asyncio.get_running_loop()
        # The connection's thread looks at ``data_version`` every interval and wakes this
        # loop only when the file changed (or this client wrote): no thread crossing per
        # interval while nothing happens.

        def changed() -> None:  # (on the connection's thread)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

        hinted = asyncio.Event()

        def woken() -> None:  # (on the loop)
            self.hints += 1
            hinted.set()
            wake.set()

        self._connection.on_change(self._interval, changed)
        if self._listener is not None:
            self._listener.start(woken)
        try:
            while self._watches:
                await wake.wait()
                wake.clear()
                hinted.clear()  # (the look below reads whatever it hinted at)
                if not self._watches:
                    break
                try:
                    data_version, writes = await self._look(data_version, writes)
                except StoreUnavailable as exc:
                    # Said, not only retried: a failure of the poller's own statements (one
                    # the electors' requests do not share) leaves every follower deaf.
                    if self._failing.allow():
                        log(
                            logger,
                            "warning",
                            "the SQLite watch cannot read the watched leases; followers hear "
                            "of no change until it can",
                            error=str(exc),
                            watched=len(self._watches),
                            suppressed=self._failing.take_suppressed(),
                        )
                    self._restart_all()
                    data_version = None
                    await asyncio.sleep(self._interval * 10)
                    wake.set()
                    continue
                # At most one look per interval, unless another process says it wrote; and
                # then rest four times the look's CPU time (not its wall time, which a busy
                # machine stretches), so that others' bursts of urgent writes (many replicas'
                # renewals, the balancer's hand-overs) keep the looks to a fifth of a core,
                # however many leases each look compares; never longer than the interval.
                rest = min(self._interval, LOOK_SHARE_REST * self._look_cpu)
                await asyncio.sleep(rest)
                if not hinted.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(hinted.wait(), self._interval - rest)
        finally:
            self._connection.on_change(self._interval, None)
            if self._listener is not None:
                self._listener.stop()
        # No await between the emptiness check and this: a new watch starts a new loop.
        self._task = None

    def _restart_all(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.restart()
        self._fresh.update(self._watches)
        self._wake.set()

    async def _look(self, last_version: int | None, last_writes: int | None) -> tuple[int, int]:
        """One poll. If the file changed since the last look (another connection committed, or
        this client wrote), or a watch is new, reads the watched rows that differ from the
        copy — every row of a new watch — and brings the copy up to date in the same read
        transaction (a commit in between would otherwise reach the copy unseen)."""
        self.looks += 1
        writes = self._connection.writes  # before the read: a write during it is re-read
        fresh = [name for name in self._fresh if name in self._watches]
        gone = list(self._gone)
        self._fresh.clear()
        self._gone.clear()
        everything = list(self._watches)  # (a connection opened anew has no copy yet)

        def look(conn: sqlite3.Connection) -> tuple[int, list[Any]]:
            began = time.thread_time()
            try:
                return compare(conn)
            finally:
                self._look_cpu = time.thread_time() - began

        def compare(conn: sqlite3.Connection) -> tuple[int, list[Any]]:
            nonlocal fresh
            (version,) = conn.execute("PRAGMA data_version").fetchone()
            if conn is not self._copied_on:
                conn.execute(WATCHED)
                fresh = everything
            elif version == last_version and writes == last_writes and not fresh and not gone:
                self._connection.looked(version, writes)
                return int(version), []
            conn.execute("BEGIN")
            try:
                if gone:
                    conn.execute(WATCHED_FORGET, {"names": json.dumps(gone)})
                if fresh:
                    conn.execute(WATCHED_NEW, {"names": json.dumps(fresh)})
                rows = conn.execute(WATCHED_CHANGED).fetchall()
                if rows:
                    conn.execute(WATCHED_SEEN)
                conn.execute("COMMIT")
                self._copied_on = conn
                # (The version was read before this read transaction began: whatever it
                # counts, the rows above include.)
                self._connection.looked(version, writes)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return int(version), rows

        try:
            version, rows = await self._connection.run(look)
        except BaseException:
            # Not known to be in the copy: told again at the next look that works.
            self._fresh.update(fresh)
            self._gone.update(name for name in gone if name not in self._watches)
            raise
        began = time.thread_time()  # (the loop's share of the look: decoding, handing on)
        watches = self._watches
        for row in rows:
            subscribed = watches.get(row[0])
            if not subscribed:
                continue
            record = lease_record(row[2:]) if row[1] else None  # absent: the row is gone
            for watch in list(subscribed):
                watch.offer(record)
        self._look_cpu += time.thread_time() - began
        return version, writes
