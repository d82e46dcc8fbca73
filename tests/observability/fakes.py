"""A hand-moved clock and a store that can be made unreachable, for driving the elector."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.memory import MemoryLeaseStore
from tests.support.clock import FakeClock

__all__ = ["FakeClock", "FlakyStore"]


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
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        await self._gate("acquire")
        return await self.inner.try_acquire(identity, duration, min_term, expected=expected)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        await self._gate("renew")
        return await self.inner.renew(identity, term, duration)

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        await self._gate("release")
        return await self.inner.release(identity, term)

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        await self._gate("mark_lost")
        return await self.inner.mark_lost(term, duration)

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        async for record in self.inner.watch():
            yield record

    async def close(self) -> None:
        await self.inner.close()
