"""Registers the SQLite store with the contract suite: one fresh file per harness."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

from sidecar.backends.sqlite import SQLiteLeaseStore, SQLiteStoreClient
from tests.contract.harness import HarnessIterator


class SQLiteHarness:
    lease_name = "contract"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stores: list[SQLiteLeaseStore] = []
        self.clients: list[SQLiteStoreClient] = []

    def new_store(self) -> SQLiteLeaseStore:
        """A lease with a client of its own, as another replica (process) would hold."""
        store = SQLiteLeaseStore(str(self.path), self.lease_name, busy_timeout=5.0)
        self.stores.append(store)
        return store

    def new_client(self) -> SQLiteStoreClient:
        client = SQLiteStoreClient(str(self.path), busy_timeout=5.0)
        self.clients.append(client)
        return client

    async def reset(self) -> None:
        lease = self.new_client().lease(self.lease_name)
        await asyncio.to_thread(lease.delete_everything)  # on a connection of its own


@contextlib.asynccontextmanager
async def sqlite_harness() -> HarnessIterator:
    with tempfile.TemporaryDirectory() as tmp:
        harness = SQLiteHarness(Path(tmp) / "leases.db")
        try:
            yield harness
        finally:
            for store in harness.stores:
                await store.close()
            for client in harness.clients:
                await client.close()


HARNESS = sqlite_harness
