from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

from sidecar.backends.sqlite import SQLiteLeaseStore
from tests.contract.harness import HarnessIterator


class SQLiteHarness:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.stores: list[SQLiteLeaseStore] = []

    def new_store(self) -> SQLiteLeaseStore:
        store = SQLiteLeaseStore(str(self.path), "contract", busy_timeout=5.0)
        self.stores.append(store)
        return store

    async def reset(self) -> None:
        await asyncio.to_thread(SQLiteLeaseStore(str(self.path), "contract").delete_everything)


@contextlib.asynccontextmanager
async def sqlite_harness() -> HarnessIterator:
    with tempfile.TemporaryDirectory() as tmp:
        harness = SQLiteHarness(Path(tmp) / "leases.db")
        try:
            yield harness
        finally:
            for store in harness.stores:
                await store.close()


HARNESS = sqlite_harness
