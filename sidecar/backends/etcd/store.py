"""One lease in etcd: the contract's requests, each one conditional ``Txn``, and its watch.

Every write compares the key's ``mod_revision`` and value with exactly what this client saw
last (from its own write, a read, or the watch) and writes only if nothing changed since
(rule 1); a ``Txn`` that finds something else reads it in the same round trip instead, and
the operation decides from that: renew and release try again on what is there while it is
still the caller's grant, everything else reports it. The term lives in the value and is
computed by the writer from the very value the ``Txn`` compares, so the grant and its term
are one atomic step: ``term = max(stored term, min_term) + 1`` (rule 5; docs/etcd.md says why
not etcd's revision).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sidecar.backends.base import (
    Conflict,
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    room_for_marker,
)
from sidecar.backends.etcd.connection import EtcdConnection
from sidecar.backends.etcd.records import (
    KeyValue,
    grant_value,
    lease_key,
    marker_value,
    range_op,
    released_value,
    renewal_value,
)
from sidecar.backends.records import MAX_TERM, check_term

# A renewal or release that finds the lease changed under it, but still the caller's grant
# (its own renewal raced a watch event, a hand-over's first renewal), tries again this often.
_TRIES = 3


class EtcdLease:
    """The store of lease ``name`` on ``client``. Cheap: it holds its key."""

    def __init__(self, client: EtcdConnection, name: str) -> None:
        self.client = client
        self.lease = name
        self.key = lease_key(client.target.prefix, name)

    @property
    def description(self) -> str:
        return f"{self.client.description} lease={self.lease}"

    def _record(self, kv: KeyValue | None) -> LeaseRecord | None:
        return None if kv is None else self.client.record(kv)

    async def _current(self) -> KeyValue | None:
        """What this client last saw of the key, else a read."""
        if self.key in self.client.seen:
            return self.client.seen[self.key]
        return await self.client.read(self.key)

    # -- the contract -----------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            return self._record(await self.client.read(self.key))

        return await self.client.guarded(work)

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        async def work() -> LeaseRecord:
            client = self.client
            if expected is None:
                seen = None
            else:
                stored = client.untagged(expected)
                seen = client.seen.get(self.key)
                if stored is None:
                    # Seen before etcd may have gone back: not a basis for a grant.
                    raise LeaseHeld(
                        "the lease was seen before etcd may have lost writes",
                        self._record(await client.read(self.key)),
                    )
                if seen is None or client.record(seen).version != expected:
                    seen = await client.read(self.key)
                    record = self._record(seen)
                    if seen is None or record is None or record.version != expected:
                        raise LeaseHeld(f"the lease is not at version {expected}", record)
            stored_term = 0 if seen is None else client.record(seen).term
            term = check_term(max(stored_term, min_term) + 1, MAX_TERM, self.description)
            value = grant_value(identity, term, duration, client.clock.wall())
            written, now = await client.swap("acquire", self.key, seen, value)
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
                written, now = await client.swap("renew", self.key, seen, value)
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
                written, now = await self.client.swap("release", self.key, seen, value)
                if written:
                    return self._record(now)
                seen = now
            raise Conflict("the lease kept changing under the release", self._record(seen))

        return await self.client.guarded(work)

    @property
    def hands_over(self) -> bool:
        """A committed ``Txn`` is on a quorum: the successor may lead on what it sees."""
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
                written, now = await client.swap("hand over", self.key, seen, value)
                if written:
                    granted = self._record(now)
                    assert granted is not None
                    return granted
                seen = now
            raise Conflict("the lease kept changing under the hand-over", self._record(seen))

        return await self.client.guarded(work)

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            seen = await self.client.read(self.key)
            if not room_for_marker(self._record(seen), term):
                return self._record(seen)
            _written, now = await self.client.swap(
                "mark lost", self.key, seen, marker_value(term, duration)
            )
            return self._record(now)

        return await self.client.guarded(work)

    # -- the watch --------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """The key once after every (re)connection of its watch stream (read linearizably,
        then watched from the revision read + 1: nothing in between is missed), then on
        every change. A value that is not ours is skipped (reads report it). Never raises."""
        subscription = self.client.hub.join(self.key, None, within=self.client.leases_range)
        try:
            while True:
                state, as_of = await subscription.next()
                kv = self.client.newest(self.key, state.get(self.key), as_of)
                yield self._record(kv)
        finally:
            self.client.hub.leave(subscription)

    async def close(self) -> None:
        """Nothing of its own: the watch stream belongs to the client."""

    # -- tests and operators ----------------------------------------------------------------

    async def delete_everything(self) -> None:
        """Delete the lease's key, term included (tests; an operator's ``etcdctl del``)."""
        await self.client.call("delete", "/v3/kv/deleterange", range_op(self.key))
        self.client.seen.pop(self.key, None)
