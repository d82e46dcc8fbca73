"""A hand-moved clock and a store that can be made unreachable, for driving the elector."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.memory import MemoryLeaseStore


class FakeClock:
    """``now()``/``wall()`` as the elector reads them; only ``advance`` moves time."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._wall = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

    def now(self) -> float:
        return self._now

    def wall(self) -> datetime:
        return self._wall

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._wall += timedelta(seconds=seconds)


class FlakyStore:
    """A `MemoryLeaseStore` that fails every mutation with `StoreUnavailable` while ``down``,
    or never answers while ``hung`` (the elector's request timeout cuts it short)."""

    def __init__(self, inner: MemoryLeaseStore) -> None:
        self.inner = inner
        self.down = False
        self.hung = False
        self.calls: Counter[str] = Counter()

    @property
    def description(self) -> str:
        return "flaky " + self.inner.description

    async def _gate(self, op: str) -> None:
        self.calls[op] += 1
        if self.hung:
            await asyncio.Event().wait()
        if self.down:
            raise StoreUnavailable(f"{op}: connection refused (test)")

    async def read(self) -> LeaseRecord | None:
        await self._gate("read")
        return await self.inner.read()

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        await self._gate("acquire")
        return await self.inner.try_acquire(identity, duration, min_term, after_reset=after_reset)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        await self._gate("renew")
        return await self.inner.renew(identity, term, duration)

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        await self._gate("release")
        return await self.inner.release(identity, term)

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        async for record in self.inner.watch():
            yield record

    async def close(self) -> None:
        await self.inner.close()
