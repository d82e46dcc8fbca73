"""`ZooKeeperStoreClient`: the leases and candidate groups of one ZooKeeper ensemble, on the
session, watch and epoch of a `connection.ZooKeeperConnection`."""

from __future__ import annotations

from sidecar.backends.zookeeper.candidates import ZooKeeperCandidates
from sidecar.backends.zookeeper.connection import ZooKeeperConnection
from sidecar.backends.zookeeper.store import ZooKeeperLease
from sidecar.backends.zookeeper.target import ZooKeeperTarget


class ZooKeeperStoreClient(ZooKeeperConnection):
    """The `StoreClient` of one ZooKeeper ensemble."""

    def lease(self, name: str) -> ZooKeeperLease:
        return ZooKeeperLease(self, name)

    def candidates(self, group: str) -> ZooKeeperCandidates:
        return ZooKeeperCandidates(self, group)


class ZooKeeperLeaseStore(ZooKeeperLease):
    """One lease with a client of its own (``--store zookeeper://…`` with one ``--lease``)."""

    def __init__(
        self, target: ZooKeeperTarget, lease: str, *, request_timeout: float = 2.0
    ) -> None:
        super().__init__(ZooKeeperStoreClient(target, request_timeout=request_timeout), lease)

    async def close(self) -> None:
        await self.client.close()
