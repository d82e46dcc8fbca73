"""Registers the etcd store with the contract suite: the session's three-member cluster
(`tests.etcd.cluster.shared_cluster`), a key prefix of its own per harness."""

from __future__ import annotations

import contextlib

from sidecar.backends.etcd import EtcdLease, EtcdStoreClient, parse_target
from tests.contract.harness import HarnessIterator
from tests.etcd.cluster import fresh_prefix, shared_cluster


class EtcdHarness:
    lease_name = "contract"

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: list[EtcdStoreClient] = []

    def new_store(self) -> EtcdLease:
        """A replica with one lease: the lease on a client of its own, as the sidecar has."""
        return self.new_client().lease(self.lease_name)

    def new_client(self) -> EtcdStoreClient:
        # Generous: 50 clients at once on 2 busy cores must not time out.
        client = EtcdStoreClient(parse_target(self.url), request_timeout=10.0)
        self.clients.append(client)
        return client

    async def reset(self) -> None:
        await self.new_client().lease(self.lease_name).delete_everything()


@contextlib.asynccontextmanager
async def etcd_harness() -> HarnessIterator:
    cluster = shared_cluster()
    harness = EtcdHarness(cluster.url(fresh_prefix("contract")))
    try:
        yield harness
    finally:
        for client in harness.clients:
            await client.close()


HARNESS = etcd_harness
