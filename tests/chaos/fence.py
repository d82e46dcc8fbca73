"""Fenced resources and the writers that use them, as an app beside each sidecar would.

A fenced resource stores the highest term it accepted and accepts a write only when the
resource's stored term is at most the writer's (``… WHERE term <= :term``); each accepted
write is appended to the resource's own log in the same atomic step, so the log's order is
the order of acceptance. Two implementations: a SQLite table and a Redis Lua script (on a
Redis server of its own that no fault touches: the resource is not the lease store).

A resource holds one such row per name (``resource``): the single-lease run writes
``default``, the sharded run one row per shard, each fenced and logged on its own.

A `FencedWriter` follows one replica's ``GET /leader``: while it answers 200 it writes with
the term of that answer, as fast as an eager app would (every few ms). It checks, then
writes: the gap between the two is where a stale leader's write slips in, and is exactly
what the fence must refuse. A `ShardWriter` follows one replica's ``GET /leases`` (long-poll)
and writes, every 20 ms, to the row of every shard that answer says it leads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp
import redis.asyncio

from tests.support.sidecars import cancel_and_wait


@dataclasses.dataclass(frozen=True)
class FencedWrite:
    identity: str
    term: int
    seq: int  # the writer's own counter: which attempt of that writer this was
    time: float  # wall clock (time.time()) when the writer sent it


DEFAULT = "default"  # the single-lease run's one row


class FencedResource(Protocol):
    kind: str

    async def write(
        self, identity: str, term: int, seq: int, sent: float, resource: str = DEFAULT
    ) -> bool: ...

    async def accepted(self, resource: str = DEFAULT) -> list[FencedWrite]:
        """Every accepted write to ``resource``, in the order the resource accepted them."""
        ...

    async def close(self) -> None: ...


class SqliteFence:
    """``UPDATE resource SET term = :term … WHERE term <= :term`` plus an INSERT into the log,
    in one transaction, on a file of its own. Durability is off (``synchronous=OFF``, WAL):
    the fence's process never crashes, and 16 shards write ~800 times a second."""

    kind = "sqlite table"

    def __init__(self, path: Path) -> None:
        self.path = path
        # One thread owns the connection: sqlite3 connections are not for sharing.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fence")
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.executescript(
            """
            PRAGMA journal_mode = WAL;
            PRAGMA synchronous = OFF;
            CREATE TABLE IF NOT EXISTS resource (name TEXT PRIMARY KEY, term INTEGER NOT NULL,
                                                 writer TEXT);
            CREATE TABLE IF NOT EXISTS log (position INTEGER PRIMARY KEY AUTOINCREMENT,
                resource TEXT NOT NULL, identity TEXT NOT NULL, term INTEGER NOT NULL,
                seq INTEGER NOT NULL, time REAL NOT NULL);
            """
        )

    def _write(self, identity: str, term: int, seq: int, sent: float, resource: str) -> bool:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT OR IGNORE INTO resource (name, term, writer) VALUES (?, -1, NULL)",
                (resource,),
            )
            changed = conn.execute(
                "UPDATE resource SET term = :term, writer = :identity "
                "WHERE name = :resource AND term <= :term",
                {"term": term, "identity": identity, "resource": resource},
            ).rowcount
            if changed:
                conn.execute(
                    "INSERT INTO log (resource, identity, term, seq, time) VALUES (?, ?, ?, ?, ?)",
                    (resource, identity, term, seq, sent),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return bool(changed)

    async def write(
        self, identity: str, term: int, seq: int, sent: float, resource: str = DEFAULT
    ) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self._write, identity, term, seq, sent, resource
        )

    async def accepted(self, resource: str = DEFAULT) -> list[FencedWrite]:
        def read() -> list[FencedWrite]:
            rows = self._conn.execute(
                "SELECT identity, term, seq, time FROM log WHERE resource = ? ORDER BY position",
                (resource,),
            ).fetchall()
            return [FencedWrite(*row) for row in rows]

        return await asyncio.get_running_loop().run_in_executor(self._executor, read)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=False)


# KEYS[1] the stored term, KEYS[2] the log (a list).
# ARGV[1] term, ARGV[2] the log entry (JSON).
_FENCED_WRITE = """
local stored = tonumber(redis.call('GET', KEYS[1]) or '-1')
if stored <= tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


class RedisFence:
    """A Lua script: ``SET term`` and ``RPUSH`` the log entry when stored term <= term."""

    kind = "redis script"

    @staticmethod
    def keys(resource: str) -> list[str]:
        """The stored term and the log of ``resource``."""
        return [f"fence:{{{resource}}}:term", f"fence:{{{resource}}}:log"]

    def __init__(self, url: str) -> None:
        self._client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
        self._script = self._client.register_script(_FENCED_WRITE)

    async def write(
        self, identity: str, term: int, seq: int, sent: float, resource: str = DEFAULT
    ) -> bool:
        entry = json.dumps({"identity": identity, "term": term, "seq": seq, "time": sent})
        return bool(await self._script(keys=self.keys(resource), args=[term, entry]))

    async def accepted(self, resource: str = DEFAULT) -> list[FencedWrite]:
        raw = await self._client.lrange(self.keys(resource)[1], 0, -1)  # type: ignore[misc]
        return [FencedWrite(**json.loads(item)) for item in raw]

    async def close(self) -> None:
        await self._client.aclose()


@dataclasses.dataclass
class WriterCounts:
    accepted: int = 0
    refused: int = 0


class FencedWriter:
    """The app beside one replica slot. ``url`` is asked afresh before every request, so the
    writer follows the slot's current process (a replacement after a kill).

    ``gate`` (the app-fault round): awaited after each 200, before the write; False skips
    the write. It is the app's own view (`tests.chaos.apps.App.may_write`): a dead or unready
    app does not write, a hung one holds its write until it thaws."""

    INTERVAL = 0.01  # between writes while leading: an eager app
    FOLLOWER_WAIT = 0.5  # long-poll while not leading: wakes at once when that changes
    TIMEOUT = 1.5  # one /leader request; a paused sidecar answers nothing

    def __init__(
        self,
        name: str,
        url: Callable[[], str],
        fence: FencedResource,
        gate: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.fence = fence
        self.gate = gate
        self.counts = WriterCounts()
        self.seq = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._run(session), name=f"writer-{self.name}")

    async def stop(self) -> None:
        self._stopping = True  # the loop's own check: a cancel() can be lost (see below)
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _run(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=self.TIMEOUT)
        etag: str | None = None  # of the last 503: long-poll until the state differs
        while not self._stopping:
            url, headers = self.url(), {}
            if etag is not None:
                url, headers = f"{url}?wait={self.FOLLOWER_WAIT}", {"If-None-Match": etag}
            body = None
            try:
                async with session.get(url, headers=headers, timeout=timeout) as response:
                    if response.status == 200:
                        body = await response.json()
                    etag = response.headers.get("ETag") if response.status == 503 else None
            except (TimeoutError, aiohttp.ClientError, ValueError):
                etag = None
                await asyncio.sleep(self.INTERVAL)  # refused at once (a restart): no spin
            if body is None:
                continue
            if self.gate is not None and not await self.gate():
                await asyncio.sleep(self.INTERVAL)  # the app cannot do the work now
                continue
            self.seq += 1
            accepted = await self.fence.write(
                body["identity"], int(body["term"]), self.seq, time.time()
            )
            if accepted:
                self.counts.accepted += 1
            else:
                self.counts.refused += 1
            await asyncio.sleep(self.INTERVAL)


class ShardWriter:
    """The app beside one replica slot of a sharded run: it follows the slot's ``GET /leases``
    (long-polling on its ETag, which changes when any lease's leader flag, holder or term
    does, a deadline passing included) and every ``INTERVAL`` writes, for each shard the last
    answer said this replica leads, to that shard's row with that shard's term.

    It writes from the last answer, not a fresh one per write: while its sidecar is paused
    (SIGSTOP) it goes on writing with the terms it last saw until its request times out, a
    stale leader's writes that the fence must refuse once a newer term has written."""

    INTERVAL = 0.02  # between two rounds of writes
    FOLLOWER_WAIT = 0.5  # long-poll: wakes at once when some lease's state changes
    TIMEOUT = 1.5  # one /leases request; a paused sidecar answers nothing

    def __init__(self, name: str, url: Callable[[], str], fence: FencedResource) -> None:
        self.name = name
        self.url = url  # the slot's current ``/leases``
        self.fence = fence
        self.counts = WriterCounts()
        self.seq = 0
        self.held: dict[str, tuple[str, int]] = {}  # lease -> (identity, term) from the last answer
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self, session: aiohttp.ClientSession) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(session), name=f"shard-follow-{self.name}"),
            asyncio.create_task(self._write(), name=f"shard-write-{self.name}"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._tasks)

    async def _follow(self, session: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=self.TIMEOUT)
        etag: str | None = None
        while not self._stopping:
            url, headers = self.url(), {}
            if etag is not None:
                url, headers = f"{url}?wait={self.FOLLOWER_WAIT}", {"If-None-Match": etag}
            try:
                async with session.get(url, headers=headers, timeout=timeout) as response:
                    body = await response.json()
                    etag = response.headers.get("ETag")
                self.held = {
                    entry["lease"]: (entry["identity"], int(entry["term"]))
                    for entry in body["leases"]
                    if entry["leader"]
                }
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
                self.held, etag = {}, None
                await asyncio.sleep(self.INTERVAL)  # refused at once (a restart): no spin

    async def _write(self) -> None:
        while not self._stopping:
            for lease, (identity, term) in list(self.held.items()):
                self.seq += 1
                if await self.fence.write(identity, term, self.seq, time.time(), lease):
                    self.counts.accepted += 1
                else:
                    self.counts.refused += 1
            await asyncio.sleep(self.INTERVAL)
