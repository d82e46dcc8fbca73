"""One lease in ZooKeeper: the contract's requests, each one conditional write, and its watch.

Every write is a ``setData`` on the data version this client saw last (from its own write, a
read, or a read the watch triggered), or a ``create`` where it saw nothing, and writes only if
nothing changed since (rule 1); a write that finds something else reads it instead, and the
operation decides from that: renew and release try again on what is there while it is still
the caller's grant, everything else reports it. The term lives in the value and is computed by
the writer from the very value the write is conditional on: ``term = max(stored term,
min_term) + 1`` (rule 5). Not the zxid: a zxid cannot be chosen above a floor, and a wiped or
restored ensemble counts its zxids again from where its data is (docs/zookeeper.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from sidecar.backends.base import Conflict, LeaseHeld, LeaseRecord, NotOwned, room_for_marker
from sidecar.backends.etcd.records import (
    grant_value,
    marker_value,
    released_value,
    renewal_value,
)
from sidecar.backends.records import MAX_TERM, check_term
from sidecar.backends.zookeeper.connection import Node, ZooKeeperConnection

# A renewal or release that finds the lease changed under it, but still the caller's grant
# (its own renewal raced a read, a hand-over's first renewal), tries again this often.
_TRIES = 3


class ZooKeeperLease:
    """The store of lease ``name`` on ``client``. Cheap: it holds its path."""

    def __init__(self, client: ZooKeeperConnection, name: str) -> None:
        self.client = client
        self.lease = name
        self.path = f"{client.leases_path}/{name}"

    @property
    def description(self) -> str:
        return f"{self.client.description} lease={self.lease}"

    def _record(self, node: Node | None) -> LeaseRecord | None:
        return None if node is None else self.client.record(node)

    async def _current(self) -> Node | None:
        """What this client last saw of the znode, else a read."""
        if self.path in self.client.seen:
            return self.client.seen[self.path]
        return await self.client.read(self.path)

    # -- the contract -----------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            return self._record(await self.client.read(self.path))

        return await self.client.guarded(work)

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        async def work() -> LeaseRecord:
            client = self.client
            seen: Node | None = None
            if expected is not None:
                if client.untagged(expected) is None:
                    # Seen before this client lost sight of the ensemble: no basis for a grant.
                    raise LeaseHeld(
                        "the lease was seen on an earlier connection",
                        self._record(await client.read(self.path)),
                    )
                seen = client.seen.get(self.path)
                if seen is None or client.record(seen).version != expected:
                    seen = await client.read(self.path)
                    record = self._record(seen)
                    if record is None or record.version != expected:
                        raise LeaseHeld(f"the lease is not at version {expected}", record)
            stored_term = 0 if seen is None else client.record(seen).term
            term = check_term(max(stored_term, min_term) + 1, MAX_TERM, self.description)
            value = grant_value(identity, term, duration, client.clock.wall())
            written, now = await client.swap("acquire", self.path, seen, value)
            record = self._record(now)
            if written:
                assert record is not None
                return record
            if expected is None or now is None:
                raise LeaseHeld(f"the lease is not at version {expected}", record)
            raise Conflict("another writer changed the lease first", record)

        return await self.client.guarded(work)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        async def work() -> LeaseRecord:
            client = self.client
            seen = await self._current()
            for _ in range(_TRIES):
                record = self._record(seen)
                value = renewal_value(record, identity, term, duration, client.clock.wall())
                if value is None:
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                written, now = await client.swap("renew", self.path, seen, value)
                if written:
                    renewed = self._record(now)
                    assert renewed is not None
                    return renewed
                seen = now
            raise Conflict("the lease kept changing under the renewal", self._record(seen))

        return await self.client.guarded(work)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            seen = await self._current()
            for _ in range(_TRIES):
                record = self._record(seen)
                if record is None or record.holder != identity or record.term != term:
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                value = released_value(term, record.duration, successor)
                written, now = await self.client.swap("release", self.path, seen, value)
                if written:
                    return self._record(now)
                seen = now
            raise Conflict("the lease kept changing under the release", self._record(seen))

        return await self.client.guarded(work)

    @property
    def hands_over(self) -> bool:
        """A write ZooKeeper answered is committed on a quorum: the successor may lead on it."""
        return True

    async def hand_over(
        self,
        identity: str,
        term: int,
        *,
        successor: str,
        handed: str,
        duration: float,
        min_term: int,
    ) -> LeaseRecord:
        async def work() -> LeaseRecord:
            client = self.client
            seen = await self._current()
            for _ in range(_TRIES):
                record = self._record(seen)
                if record is None or record.holder != identity or record.term != term:
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                new_term = max(record.term, min_term) + 1
                check_term(new_term, MAX_TERM, self.description)
                value = grant_value(
                    successor, new_term, duration, client.clock.wall(), handed=handed
                )
                written, now = await client.swap("hand over", self.path, seen, value)
                if written:
                    granted = self._record(now)
                    assert granted is not None
                    return granted
                seen = now
            raise Conflict("the lease kept changing under the hand-over", self._record(seen))

        return await self.client.guarded(work)

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            seen = await self.client.read(self.path)
            if not room_for_marker(self._record(seen), term):
                return self._record(seen)
            _written, now = await self.client.swap(
                "mark lost", self.path, seen, marker_value(term, duration)
            )
            return self._record(now)

        return await self.client.guarded(work)

    # -- the watch --------------------------------------------------------------------------

    def follow(self, callback: Callable[[LeaseRecord | None], None]) -> Callable[[], None]:
        """`FollowsByCall`: the record after every (re)arming of the client's watch and after
        every change it reports, read from the server (events carry no data). Reads of one
        lease never overlap: changes during a read are read once more after it."""
        state = {"reading": False, "again": False, "stopped": False}

        async def read_loop() -> None:
            while state["again"] and not state["stopped"]:
                state["again"] = False
                try:
                    node = await self.client.read(self.path)
                except Exception:  # unavailable: the next connection reads again
                    continue
                if not state["stopped"]:
                    callback(self._record(node))
            state["reading"] = False

        def changed() -> None:
            state["again"] = True
            if not state["reading"]:
                state["reading"] = True
                task = asyncio.get_running_loop().create_task(read_loop())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        tasks: set[asyncio.Task[None]] = set()
        unfollow = self.client.follow(self.path, changed)

        def stop() -> None:
            state["stopped"] = True
            unfollow()
            for task in tasks:
                task.cancel()

        return stop

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """What `follow` calls with, as an iterator. Never raises."""
        queue: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop = self.follow(queue.put_nowait)
        try:
            while True:
                yield await queue.get()
        finally:
            stop()

    async def close(self) -> None:
        """Nothing of its own: the watch belongs to the client."""

    # -- tests and operators ----------------------------------------------------------------

    async def delete_everything(self) -> None:
        """Delete the lease's znode, term included (tests; an operator's ``deleteall``)."""
        await self.client.delete(self.path)
