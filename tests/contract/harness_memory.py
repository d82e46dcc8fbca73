from __future__ import annotations

import contextlib

from sidecar.backends.memory import MemoryLeaseStore, MemoryServer, MemoryStoreClient
from tests.contract.harness import HarnessIterator


class MemoryHarness:
    lease_name = "contract"

    def __init__(self) -> None:
        self.server = MemoryServer()

    def new_store(self) -> MemoryLeaseStore:
        return self.new_client().lease(self.lease_name)

    def new_client(self) -> MemoryStoreClient:
        return MemoryStoreClient(self.server)

    async def reset(self) -> None:
        self.server.state(self.lease_name).delete()


@contextlib.asynccontextmanager
async def memory_harness() -> HarnessIterator:
    yield MemoryHarness()


HARNESS = memory_harness
