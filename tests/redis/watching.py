"""Collecting what a store's ``watch()`` yields, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from sidecar.backends.base import LeaseRecord, LeaseStore


@contextlib.asynccontextmanager
async def watching(store: LeaseStore) -> AsyncIterator[asyncio.Queue[LeaseRecord | None]]:
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()

    async def follow() -> None:
        async for record in store.watch():
            await seen.put(record)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), "the watch ended on its own (it must run until cancelled)"


async def next_matching(
    queue: asyncio.Queue[LeaseRecord | None],
    predicate: Callable[[LeaseRecord | None], bool],
    timeout: float,
) -> LeaseRecord | None:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the watch yielded no matching record within {timeout}s")
        record = await asyncio.wait_for(queue.get(), remaining)
        if predicate(record):
            return record
