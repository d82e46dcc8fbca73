"""One lease kept as a JSON value (`lease_json`) under one key, written only by a versioned
compare-and-swap: the contract's requests for the stores that offer such a write (etcd's
``Txn``, ZooKeeper's ``setData``/``create`` on a data version). A store supplies its
connection (`SwapClient`: a read, the swap, what it last saw of each key) and subclasses
`SwapLease` with its watch.

Every write is conditional on exactly what the client saw last of the key (from its own write,
a read, or its watch), or on its absence, and writes only if nothing changed since (rule 1); a
swap that finds something else reads it instead, and the operation decides from that: renew,
release and hand over try again on what is there while it is still the caller's grant,
everything else reports it. The term lives in the value and is computed by the writer from the
very value the swap is conditional on, so the grant and its term are one atomic step: ``term =
max(stored term, min_term) + 1`` (rule 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from typing import Generic, Protocol, TypeVar

from sidecar.backends.base import Conflict, LeaseHeld, LeaseRecord, NotOwned, room_for_marker
from sidecar.backends.kit.lease_json import (
    grant_value,
    marker_value,
    released_value,
    renewal_value,
)
from sidecar.backends.records import MAX_TERM, check_term
from sidecar.clock import Clock

K = TypeVar("K", bound=Hashable)  # a key: etcd's bytes, a znode's path
N = TypeVar("N")  # a key as the store answered it: its value and what the swap compares
T = TypeVar("T")

# A renewal, release or hand-over that finds the lease changed under it, but still the
# caller's grant (its own renewal raced a watch event or a read, a hand-over's first renewal),
# tries again this often.
_TRIES = 3


class SwapClient(Protocol[K, N]):
    """What `SwapLease` borrows of a store's connection."""

    @property
    def clock(self) -> Clock: ...

    @property
    def description(self) -> str: ...

    @property
    def seen(self) -> MutableMapping[K, N | None]:
        """What was last seen of each key (None: absent)."""
        ...

    def record(self, node: N, /) -> LeaseRecord:
        """The record ``node`` holds, its version tagged with the client's epoch."""
        ...

    def untagged(self, version: str, /) -> str | None:
        """The stored version a reported one names; None if reported in an earlier epoch."""
        ...

    async def read(self, key: K, /) -> N | None:
        """The key as the store has it now (None: absent), remembered in ``seen``."""
        ...

    async def swap(
        self, what: str, key: K, seen: N | None, value: bytes, /
    ) -> tuple[bool, N | None]:
        """Write ``value`` if ``key`` still holds exactly ``seen`` (None: nothing). Returns
        (written, what the key holds now): the write, or what the store has instead."""
        ...

    async def guarded(self, work: Callable[[], Awaitable[T]], /) -> T:
        """Run one store operation; a failure that is not an answer about the lease becomes
        `StoreUnavailable`."""
        ...


class SwapLease(Generic[K, N]):
    """The store of lease ``name`` under ``key`` on ``client``. Cheap: it holds its key.

    ``earlier_epoch``: why a version seen in an earlier epoch of the client is no basis for a
    grant, in the store's words."""

    earlier_epoch = "the lease was seen before the store may have lost writes"

    def __init__(self, client: SwapClient[K, N], name: str, key: K) -> None:
        self.client = client
        self.lease = name
        self.key = key

    @property
    def description(self) -> str:
        return f"{self.client.description} lease={self.lease}"

    def _record(self, node: N | None) -> LeaseRecord | None:
        return None if node is None else self.client.record(node)

    async def _current(self) -> N | None:
        """What the client last saw of the key, else a read."""
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
            seen: N | None = None
            if expected is not None:
                if client.untagged(expected) is None:
                    raise LeaseHeld(self.earlier_epoch, self._record(await client.read(self.key)))
                seen = client.seen.get(self.key)
                if seen is None or client.record(seen).version != expected:
                    seen = await client.read(self.key)
                    record = self._record(seen)
                    if record is None or record.version != expected:
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
        """A swap the store answered is committed on a quorum: the successor may lead on it."""
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
