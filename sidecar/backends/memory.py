"""An in-process lease store: the reference implementation of the contract, for tests and
benchmarks. Several electors in one process may share one `MemoryLeaseState`; its clock is
injectable so unit tests can move time by hand."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from sidecar.backends.base import LeaseHeld, LeaseRecord, NotOwned, StoreBehind
from sidecar.clock import SYSTEM_CLOCK, Clock


@dataclasses.dataclass
class _Row:
    holder: str | None
    term: int
    duration: float
    expires_at: float
    version: int
    acquired_at: object
    renewed_at: object


class MemoryLeaseState:
    """The shared 'server': one row, a version counter and change subscribers."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.row: _Row | None = None
        self._version = 0
        self._changed = asyncio.Event()

    def next_version(self) -> int:
        self._version += 1
        return self._version

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
        row = self.row
        if row is None:
            return None
        expires_in = max(0.0, row.expires_at - self.clock.now()) if row.holder else 0.0
        return LeaseRecord(
            holder=row.holder,
            term=row.term,
            duration=row.duration,
            expires_in=expires_in,
            version=str(row.version),
            acquired_at=row.acquired_at,  # type: ignore[arg-type]
            renewed_at=row.renewed_at,  # type: ignore[arg-type]
        )


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
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        state, now = self.state, self.state.clock.now()
        row = state.row
        if row is not None and row.holder not in (None, identity) and row.expires_at > now:
            raise LeaseHeld(f"held by {row.holder}", state.record())
        if (row.term if row else 0) < min_term and not after_reset:
            raise StoreBehind(f"the store's term is below {min_term}", state.record())
        wall = state.clock.wall()
        stored_term = row.term if row is not None else 0
        state.row = _Row(
            holder=identity,
            term=max(stored_term, min_term) + 1,
            duration=duration,
            expires_at=now + duration,
            version=state.next_version(),
            acquired_at=wall,
            renewed_at=wall,
        )
        state.notify()
        record = state.record()
        assert record is not None
        return record

    def _owned_row(self, identity: str, term: int) -> _Row:
        row = self.state.row
        if row is None or row.holder != identity or row.term != term:
            raise NotOwned(f"not held by {identity} with term {term}", self.state.record())
        return row

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        row = self._owned_row(identity, term)
        if row.expires_at <= self.state.clock.now():
            raise NotOwned("the lease expired before it was renewed", self.state.record())
        row.expires_at = self.state.clock.now() + duration
        row.duration = duration
        row.renewed_at = self.state.clock.wall()
        row.version = self.state.next_version()
        record = self.state.record()
        assert record is not None
        return record

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        row = self._owned_row(identity, term)
        row.holder = None
        row.expires_at = 0.0
        row.version = self.state.next_version()
        self.state.notify()
        return self.state.record()

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        while True:
            await self.state.wait_changed()
            yield self.state.record()

    async def close(self) -> None:
        return None
