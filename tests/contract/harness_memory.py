from __future__ import annotations

import contextlib

from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore
from tests.contract.harness import HarnessIterator


class MemoryHarness:
    def __init__(self) -> None:
        self.state = MemoryLeaseState()

    def new_store(self) -> MemoryLeaseStore:
        return MemoryLeaseStore(self.state, "contract")

    async def reset(self) -> None:
        self.state.delete()


@contextlib.asynccontextmanager
async def memory_harness() -> HarnessIterator:
    yield MemoryHarness()


HARNESS = memory_harness
