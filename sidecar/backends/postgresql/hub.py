"""One LISTEN connection for every watched lease and followed candidate group of a client,
fanning the notifications out: a thousand leases must not mean a thousand connections.

Every write of a lease row is announced by a trigger in the writer's transaction, with the
record in the payload, so a follower sees each grant, renewal and release as it commits,
without a read. After every (re)connection — LISTEN first, then a read of every watched row —
each watch gets the current record, so a notification missed while the connection was down
cannot leave a follower waiting for a lease already free. Every reconnection starts a new
epoch (the server may have failed over or restarted, and an older row may be back).

A session that goes quiet (a partition that drops packets, a paused server) is found by a
ping every `PING` seconds: no answer within `PING_TIMEOUT` closes it, and it reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Protocol

import asyncpg

from sidecar.backends.kit.backoff import Backoff, reconnect_forever
from sidecar.backends.kit.subscription import Subscription
from sidecar.backends.postgresql import schema

if TYPE_CHECKING:
    from sidecar.backends.base import StoreUnavailable
    from sidecar.supervisor import Supervisor


class ListenSource(Protocol):
    """What the hub needs of its client's connection (`connection.PostgresConnection`)."""

    WATCH_BACKOFF: tuple[float, float]
    supervisor: Supervisor

    async def connect(self) -> asyncpg.Connection: ...
    async def ensure_schema(self) -> None: ...
    def tag(self) -> str: ...
    def new_epoch(self) -> None: ...
    def unavailable(self, exc: BaseException) -> StoreUnavailable: ...


class GroupFollower:
    """One running ``changes()`` of a candidate group: woken by every notice of the group."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.ready = asyncio.Event()
        self.ended = False


class ListenHub:
    # Seconds between pings of a quiet connection, and how long a ping may take.
    PING = 2.0
    PING_TIMEOUT = 5.0

    def __init__(self, client: ListenSource) -> None:
        self._client = client
        self._watches: dict[str, set[Subscription]] = {}
        self._followers: dict[str, set[GroupFollower]] = {}
        self._connected = False
        self._notices: asyncio.Queue[str | None] | None = None  # the live session's
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connections = 0  # LISTEN connections opened so far (for tests and logs)

    # -- joining and leaving ------------------------------------------------------------------

    def watch(self, name: str) -> Subscription:
        watch = Subscription(name)
        self._watches.setdefault(name, set()).add(watch)
        if self._notices is not None:
            self._notices.put_nowait("")  # wake the session: it reads the new watch's row
        self._start()
        return watch

    def unwatch(self, watch: Subscription) -> None:
        watches = self._watches.get(watch.name)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.name]
        watch.end()

    def follow(self, group: str) -> GroupFollower:
        follower = GroupFollower(group)
        self._followers.setdefault(group, set()).add(follower)
        if self._connected:
            follower.ready.set()  # connected already: read the group now
        self._start()
        return follower

    def unfollow(self, follower: GroupFollower) -> None:
        followers = self._followers.get(follower.group)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self._followers[follower.group]
        follower.ended = True
        follower.ready.set()

    def connected(self) -> bool:
        """The LISTEN connection is up: no notification goes unseen."""
        return self._connected

    def _start(self) -> None:
        self._wake.set()
        if self._task is None:
            self._task = self._client.supervisor.spawn("postgresql-listen", self._run)

    async def close(self) -> None:
        for watches in list(self._watches.values()):
            for watch in list(watches):
                self.unwatch(watch)
        for followers in list(self._followers.values()):
            for follower in list(followers):
                self.unfollow(follower)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- the connection -------------------------------------------------------------------

    async def _run(self) -> None:
        """Keep one LISTEN session while anyone watches; never raises."""
        await reconnect_forever(
            self._serve,
            backoff=Backoff(*self._client.WATCH_BACKOFF),
            failed=self._failed,
            wanted=self._until_watched,
            closed=self._closed,
        )

    async def _until_watched(self) -> None:
        while not self._watches and not self._followers:
            self._wake.clear()
            await self._wake.wait()

    def _failed(self, exc: Exception) -> None:
        self._client.new_epoch()  # the server may have failed over or restarted
        self._client.unavailable(exc)  # logged once per distinct problem

    async def _closed(self) -> None:
        self._connected = False
        self._notices = None

    async def _serve(self) -> None:
        """One connection's life: LISTEN, read every watched row, then deliver notifications
        until the connection fails or nobody watches any more."""
        client = self._client
        timeout = self.PING_TIMEOUT  # the hub's own session: nobody's request waits on it
        notices: asyncio.Queue[str | None] = asyncio.Queue()
        self._notices = notices
        connection = await client.connect()  # bounded by the client's connect timeout
        self.connections += 1
        try:
            connection.add_termination_listener(lambda _c: notices.put_nowait(None))
            await asyncio.wait_for(
                connection.add_listener(
                    schema.CHANNEL, lambda _c, _pid, _ch, payload: notices.put_nowait(payload)
                ),
                timeout,
            )
            await client.ensure_schema()
            await self._relist(connection, timeout)
            self._connected = True
            for followers in self._followers.values():
                for follower in followers:
                    follower.ready.set()
            known = set(self._watches)
            while self._watches or self._followers:
                try:
                    payload = await asyncio.wait_for(notices.get(), self.PING)
                except TimeoutError:
                    # Patient: a ping that fails ends the session, which costs a new epoch
                    # (every follower times its lease anew) — not for a server merely slow.
                    await asyncio.wait_for(connection.fetchval("SELECT 1"), self.PING_TIMEOUT)
                    payload = ""
                if payload is None or connection.is_closed():
                    raise ConnectionError("the LISTEN connection closed")
                if payload:
                    self._deliver(payload)
                fresh = set(self._watches) - known
                if fresh:  # watches that joined since the last read: tell them what is there
                    await self._relist(connection, timeout, sorted(fresh))
                    known |= fresh
                known &= set(self._watches)
        finally:
            with contextlib.suppress(Exception):
                connection.terminate()

    async def _relist(
        self, connection: asyncpg.Connection, timeout: float, names: list[str] | None = None
    ) -> None:
        wanted = names if names is not None else sorted(self._watches)
        if not wanted:
            return
        rows = await asyncio.wait_for(connection.fetch(schema.READ_MANY, wanted), timeout)
        tag = self._client.tag()
        records = {row["name"]: schema.lease_record(row, tag) for row in rows}
        for name in wanted:
            for watch in list(self._watches.get(name, ())):
                watch.offer(records.get(name), again=True)

    def _deliver(self, payload: str) -> None:
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            return  # not ours: something else notifies on our channel
        if not isinstance(data, dict):
            return
        if "group" in data:
            for follower in self._followers.get(str(data["group"]), ()):
                follower.ready.set()
            return
        if data.get("truncated"):
            # Every row went at once: read them all again (no row means None).
            for watches in self._watches.values():
                for watch in watches:
                    watch.offer(None)
            return
        name = data.get("lease")
        listening = self._watches.get(str(name)) if name is not None else None
        if not listening:
            return
        try:
            record = None if data.get("deleted") else schema.lease_record(data, self._client.tag())
        except (KeyError, TypeError, ValueError):
            return  # a payload that is not ours
        for watch in list(listening):
            watch.offer(record)
