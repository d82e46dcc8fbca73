"""An in-process lease store: the reference implementation of the contract, for tests and
benchmarks. Several electors in one process may share one `MemoryLeaseState`; its clock is
injectable so unit tests can move time by hand."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
from collections.abc import AsyncIterator, Sequence

from sidecar.backends import records
from sidecar.backends.base import (
    Candidate,
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    Renewal,
    RenewalOutcome,
    lost_grant,
    room_for_marker,
)
from sidecar.backends.records import MAX_TERM, check_term
from sidecar.clock import SYSTEM_CLOCK, Clock


@dataclasses.dataclass
class _Row:
    holder: str | None
    term: int
    duration: float
    version: str
    released: bool
    acquired_at: object
    renewed_at: object
    successor: str | None = None
    handed: str | None = None


class MemoryLeaseState:
    """The shared 'server': one row, a version counter and change subscribers."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.row: _Row | None = None
        self._version = 0
        self._changed = asyncio.Event()

    def next_version(self) -> str:
        """New on every write, and never reused, even after `delete`."""
        self._version += 1
        return f"m{self._version}"

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def delete(self) -> None:
        """Forget the record entirely, term included (a reset or deleted store)."""
        self.row = None
        self.notify()

    def record(self) -> LeaseRecord | None:
        """The row as a checked record (a test may put anything in it, as a hand edit
        would in a real store)."""
        row = self.row
        if row is None:
            return None
        return records.lease_record(
            holder=row.holder,
            term=row.term,
            duration=row.duration,
            version=row.version,
            released=row.released,
            successor=row.successor,
            handed=row.handed,
            acquired_at=row.acquired_at,
            renewed_at=row.renewed_at,
        )

    def stored_term(self) -> int:
        """The row's term if a grant could have written it, else 0: what a grant counts from."""
        term = self.row.term if self.row is not None else 0
        return term if type(term) is int and 0 <= term <= records.MAX_TERM else 0


class MemoryLeaseStore:
    """One client of a `MemoryLeaseState`. Every method is atomic because nothing awaits
    between reading and writing the row."""

    def __init__(self, state: MemoryLeaseState | None = None, name: str = "default") -> None:
        self.state = state or MemoryLeaseState()
        self.name = name

    @property
    def description(self) -> str:
        return f"memory lease={self.name}"

    async def read(self) -> LeaseRecord | None:
        return self.state.record()

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        state = self.state
        row = state.row
        if (row.version if row is not None else None) != expected:
            raise LeaseHeld(f"the lease is not at version {expected}", state.record())
        wall = state.clock.wall()
        term = check_term(max(state.stored_term(), min_term) + 1, MAX_TERM, self.description)
        state.row = _Row(
            holder=identity,
            term=term,
            duration=duration,
            version=state.next_version(),
            released=False,
            acquired_at=wall,
            renewed_at=wall,
        )
        return self._changed()

    def _changed(self) -> LeaseRecord:
        self.state.notify()
        record = self.state.record()
        assert record is not None
        return record

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        return renew_now(self.state, identity, term, duration)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        row = self.state.row
        if row is None or row.holder != identity or row.term != term:
            raise NotOwned(f"not held by {identity} with term {term}", self.state.record())
        row.holder = None
        row.released = True
        row.successor = successor
        row.handed = None
        row.version = self.state.next_version()
        return self._changed()

    @property
    def hands_over(self) -> bool:
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
        state = self.state
        row = state.row
        if row is None or row.holder != identity or row.term != term:
            raise NotOwned(f"not held by {identity} with term {term}", state.record())
        wall = state.clock.wall()
        state.row = _Row(
            holder=successor,
            term=check_term(max(row.term, min_term) + 1, MAX_TERM, self.description),
            duration=duration,
            version=state.next_version(),
            released=False,
            acquired_at=wall,
            renewed_at=wall,
            handed=handed,
        )
        return self._changed()

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        state = self.state
        if room_for_marker(state.record(), term):
            wall = state.clock.wall()
            state.row = _Row(None, term, duration, state.next_version(), False, None, wall)
            return self._changed()
        return state.record()

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        yield self.state.record()
        while True:
            await self.state.wait_changed()
            yield self.state.record()

    async def close(self) -> None:
        return None


def renew_now(state: MemoryLeaseState, identity: str, term: int, duration: float) -> LeaseRecord:
    """`MemoryLeaseStore.renew`, atomic since it never awaits; `MemoryStoreClient.renew_many`
    runs it for every lease of a batch."""
    row = state.row
    wall = state.clock.wall()
    if lost_grant(state.record(), term):
        # The store lost our grant: put it back, term and all (see the contract).
        state.row = _Row(identity, term, duration, state.next_version(), False, wall, wall)
    elif row is None or row.holder != identity or row.term != term:
        raise NotOwned(f"not held by {identity} with term {term}", state.record())
    else:
        row.duration = duration
        row.renewed_at = wall
        row.version = state.next_version()
        row.handed = None
    state.notify()
    record = state.record()
    assert record is not None
    return record


class MemoryServer:
    """Many leases and candidate groups in one process: what a `MemoryStoreClient` talks to."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.leases: dict[str, MemoryLeaseState] = {}
        self.groups: dict[str, dict[str, Candidate]] = {}
        self.followers: dict[str, set[asyncio.Queue[None]]] = {}  # per group: `changes` runs
        self._beats = 0
        self.batches = 0  # `renew_many` calls, for tests that count requests

    def state(self, name: str) -> MemoryLeaseState:
        if name not in self.leases:
            self.leases[name] = MemoryLeaseState(self.clock)
        return self.leases[name]

    def next_beat(self) -> str:
        self._beats += 1
        return f"c{self._beats}"


class MemoryCandidates:
    def __init__(self, server: MemoryServer, group: str) -> None:
        self.server = server
        self.group = group
        self._following = 0

    async def beat(self, candidate: Candidate, duration: float) -> None:
        records = self.server.groups.setdefault(self.group, {})
        old = records.get(candidate.identity)
        version = candidate.version or self.server.next_beat()
        records[candidate.identity] = dataclasses.replace(
            candidate, version=version, beat_at=self.server.clock.wall()
        )
        if old is None or _announced(old) != _announced(candidate):
            self._announce()

    async def beat_and_list(self, candidate: Candidate, duration: float) -> list[Candidate]:
        """`ListsOnBeat`: nothing awaits between the two."""
        await self.beat(candidate, duration)
        return await self.list()

    async def list(self) -> list[Candidate]:
        """Checked, as a store's decoding checks them (a test may plant anything)."""
        return [
            records.candidate(
                identity=c.identity,
                version=c.version,
                revision=c.revision,
                priority=c.priority,
                leaving=c.leaving,
                started_at=c.started_at,
                beat_at=c.beat_at,
                app=c.app,
            )
            for c in self.server.groups.get(self.group, {}).values()
        ]

    async def leave(self, identity: str) -> None:
        if self.server.groups.get(self.group, {}).pop(identity, None) is not None:
            self._announce()

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        notices: asyncio.Queue[None] = asyncio.Queue()
        followers = self.server.followers.setdefault(self.group, set())
        followers.add(notices)
        self._following += 1
        try:
            yield None
            while True:
                await notices.get()
                yield None
        finally:
            self._following -= 1
            followers.discard(notices)

    def following(self) -> bool:
        return self._following > 0

    def _announce(self) -> None:
        for notices in self.server.followers.get(self.group, ()):
            notices.put_nowait(None)


def _announced(candidate: Candidate) -> tuple[str, int, bool]:
    """What a change notice is sent for: the fields a hand-over chooses by."""
    return (candidate.revision, candidate.priority, candidate.leaving)


class MemoryStoreClient:
    """One replica's client of a `MemoryServer`."""

    def __init__(self, server: MemoryServer | None = None) -> None:
        self.server = server or MemoryServer()

    @property
    def description(self) -> str:
        return "memory"

    def lease(self, name: str) -> MemoryLeaseStore:
        return MemoryLeaseStore(self.server.state(name), name)

    def candidates(self, group: str) -> MemoryCandidates:
        return MemoryCandidates(self.server, group)

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """Every renewal in one step (nothing awaits in between): `RenewsMany`."""
        if not renewals:
            return []
        self.server.batches += 1
        outcomes: list[RenewalOutcome] = []
        for renewal in renewals:
            state = self.server.state(renewal.name)
            try:
                outcomes.append(renew_now(state, renewal.identity, renewal.term, renewal.duration))
            except NotOwned as refused:
                outcomes.append(refused)
        return outcomes

    async def close(self) -> None:
        return None
