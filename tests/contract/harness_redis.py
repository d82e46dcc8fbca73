"""Registers the Redis store with the contract suite: one fresh redis-server per harness."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from sidecar.backends.redis import RedisLease, RedisStoreClient, parse_target
from tests.contract.harness import HarnessIterator
from tests.redis.servers import RedisServer


class RedisHarness:
    lease_name = "contract"

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.clients: list[RedisStoreClient] = []

    def new_store(self) -> RedisLease:
        """A replica with one lease: the lease on a client of its own, as the sidecar has."""
        return self.new_client().lease(self.lease_name)

    def new_client(self) -> RedisStoreClient:
        client = RedisStoreClient(parse_target(self.server.url), request_timeout=5.0)
        self.clients.append(client)
        return client

    async def reset(self) -> None:
        await self.new_client().lease(self.lease_name).delete_everything()


@contextlib.asynccontextmanager
async def redis_harness() -> HarnessIterator:
    with tempfile.TemporaryDirectory(prefix="redis-contract-") as tmp:
        server = RedisServer.start(Path(tmp))
        harness = RedisHarness(server)
        try:
            yield harness
        finally:
            for client in harness.clients:
                await client.close()
            server.stop()


HARNESS = redis_harness
