"""Registers the Redis store with the contract suite: one fresh redis-server per harness."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from sidecar.backends.redis import RedisLeaseStore, parse_target
from tests.contract.harness import HarnessIterator
from tests.redis.servers import RedisServer


class RedisHarness:
    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.stores: list[RedisLeaseStore] = []

    def new_store(self) -> RedisLeaseStore:
        store = RedisLeaseStore(parse_target(self.server.url), "contract", request_timeout=5.0)
        self.stores.append(store)
        return store

    async def reset(self) -> None:
        store = self.new_store()
        await store.delete_everything()


@contextlib.asynccontextmanager
async def redis_harness() -> HarnessIterator:
    with tempfile.TemporaryDirectory(prefix="redis-contract-") as tmp:
        server = RedisServer.start(Path(tmp))
        harness = RedisHarness(server)
        try:
            yield harness
        finally:
            for store in harness.stores:
                await store.close()
            server.stop()


HARNESS = redis_harness
