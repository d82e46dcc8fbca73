"""One change poller per client, fanned out to every lease watch of that client.

``PRAGMA data_version`` changes when another connection commits: a microsecond local read, so
polling it every interval sees every write within one interval. A thousand leases must not
mean a thousand such loops: one loop polls, and only when something changed reads the rows of
every watched lease in one statement and hands each watch its row if its version moved.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.sqlite.connection import Connection
from sidecar.backends.sqlite.schema import READ_MANY, lease_record
from sidecar.supervisor import Supervisor

# What a subscription has seen before its first yield: unlike any version, and unlike None
# (no row), so the first look always yields.
_UNSEEN: Any = object()


class Subscription:
    """One running ``watch()``: the latest record not yet yielded, and a flag to wake it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: LeaseRecord | None = _UNSEEN
        self.latest: LeaseRecord | None = None
        self.ready = asyncio.Event()
        self.ended = False

    @property
    def fresh(self) -> bool:
        """Started (or restarted after a failure) and not yet told the current record."""
        return self.seen is _UNSEEN

    def offer(self, record: LeaseRecord | None) -> None:
        """Yield ``record`` if it differs from the last one yielded: a new version, or the
        same version with other contents (a hand edit, which leaves the version as it was)."""
        if self.fresh or record != self.seen:
            self.seen = record
            self.latest = record
            self.ready.set()

    def restart(self) -> None:
        """Yield the record again once reads work: a reconnection, as the contract asks."""
        self.seen = _UNSEEN

    def end(self) -> None:
        self.ended = True
        self.ready.set()


class WatchHub:
    """The client's one poller. It runs while at least one watch does."""

    def __init__(self, connection: Connection, interval: float, supervisor: Supervisor) -> None:
        self._connection = connection
        self._interval = interval
        self._supervisor = supervisor  # restarts the poller if it fails
        self._watches: dict[str, set[Subscription]] = {}
        self._names: tuple[list[str], str] | None = None  # watched names, and as JSON
        self._rows: dict[str, Any] = {}  # each watched row as last read, undecoded
        self._fresh: set[str] = set()  # names with a watch not yet told its record
        self._task: asyncio.Task[None] | None = None

    @property
    def polling(self) -> bool:
        return self._task is not None

    def subscribe(self, name: str) -> Subscription:
        watch = Subscription(name)
        self._watches.setdefault(name, set()).add(watch)
        self._fresh.add(name)
        self._names = None
        if self._task is None:
            self._task = self._supervisor.spawn("sqlite-watch", self._poll)
        return watch

    def unsubscribe(self, watch: Subscription) -> None:
        watches = self._watches.get(watch.name)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.name]
                self._rows.pop(watch.name, None)
                self._names = None
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
        """Until no watch is left. Raises only on a bug: the supervisor then starts it again
        (with ``_task`` still set, so that a new watch does not start a second poller)."""
        data_version: int | None = None
        writes: int | None = None
        while self._watches:
            try:
                data_version, writes = await self._look(data_version, writes)
            except StoreUnavailable:
                for watches in self._watches.values():
                    for watch in watches:
                        watch.restart()
                self._fresh.update(self._watches)
                data_version = None
                await asyncio.sleep(self._interval * 10)
                continue
            await asyncio.sleep(self._interval)
        # No await between the emptiness check and this: a new watch starts a new loop.
        self._task = None

    async def _look(self, last_version: int | None, last_writes: int | None) -> tuple[int, int]:
        """One poll. Reads every watched row if the file changed since the last look (another
        connection committed, or this client wrote), else only the rows of new watches."""
        writes = self._connection.writes  # before the read: a write during it is re-read
        if self._names is None:
            watched = sorted(self._watches)
            self._names = (watched, json.dumps(watched))
        everything = self._names
        fresh = sorted(name for name in self._fresh if name in self._watches)

        def look(conn: sqlite3.Connection) -> tuple[int, list[str], list[Any]]:
            (version,) = conn.execute("PRAGMA data_version").fetchone()
            if version != last_version or writes != last_writes:
                names, names_json = everything
            elif fresh:
                names, names_json = fresh, json.dumps(fresh)
            else:
                return int(version), [], []
            return int(version), names, conn.execute(READ_MANY, {"names": names_json}).fetchall()

        version, names, rows = await self._connection.run(look)
        found = {row[0]: tuple(row[1:]) for row in rows}
        for name in names:
            row = found.get(name)  # absent: the row is gone (None)
            watches = list(self._watches.get(name, ()))
            if row == self._rows.get(name, _UNSEEN) and not any(w.fresh for w in watches):
                continue  # as last read: no need to decode it again (1,000 rows per write)
            self._rows[name] = row
            record = lease_record(row) if row is not None else None
            for watch in watches:
                watch.offer(record)
        self._fresh.difference_update(names)
        return version, writes
