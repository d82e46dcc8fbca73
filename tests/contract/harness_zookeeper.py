"""Registers the ZooKeeper store with the contract suite: the session's standalone server
(`tests.zookeeper.servers.shared_standalone`), a chroot of its own per harness."""

from __future__ import annotations

import contextlib

from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.store import ZooKeeperLease
from sidecar.backends.zookeeper.target import parse_target
from tests.contract.harness import HarnessIterator
from tests.zookeeper.servers import fresh_chroot, shared_standalone


class ZooKeeperHarness:
    lease_name = "contract"

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: list[ZooKeeperStoreClient] = []

    def new_store(self) -> ZooKeeperLease:
        """A replica with one lease: the lease on a client of its own, as the sidecar has."""
        return self.new_client().lease(self.lease_name)

    def new_client(self) -> ZooKeeperStoreClient:
        # Generous: 50 clients at once on 2 busy cores must not time out.
        client = ZooKeeperStoreClient(parse_target(self.url), request_timeout=10.0)
        self.clients.append(client)
        return client

    async def reset(self) -> None:
        await self.new_client().lease(self.lease_name).delete_everything()


@contextlib.asynccontextmanager
async def zookeeper_harness() -> HarnessIterator:
    server = shared_standalone()
    harness = ZooKeeperHarness(server.url(fresh_chroot("contract")))
    try:
        yield harness
    finally:
        for client in harness.clients:
            await client.close()


HARNESS = zookeeper_harness
