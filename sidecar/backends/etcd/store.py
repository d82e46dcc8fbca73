"""One lease in etcd: the contract's requests, each one conditional ``Txn``
(`sidecar.backends.kit.swap_lease`), and its watch.

A swap is a ``Txn`` comparing the key's ``mod_revision`` and value with exactly what this
client saw last; one that finds something else reads it in the same round trip. The term lives
in the value (docs/etcd.md says why not etcd's revision).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sidecar.backends.base import LeaseRecord
from sidecar.backends.etcd.connection import EtcdConnection
from sidecar.backends.etcd.records import KeyValue, lease_key, range_op
from sidecar.backends.kit.swap_lease import SwapLease


class EtcdLease(SwapLease[bytes, KeyValue]):
    """The store of lease ``name`` on ``client``. Cheap: it holds its key."""

    earlier_epoch = "the lease was seen before etcd may have lost writes"
    client: EtcdConnection

    def __init__(self, client: EtcdConnection, name: str) -> None:
        super().__init__(client, name, lease_key(client.target.prefix, name))

    # -- the watch --------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """The key once after every (re)connection of its watch stream (read linearizably,
        then watched from the revision read + 1: nothing in between is missed), then on
        every change. A value that is not ours is skipped (reads report it). Never raises."""
        subscription = self.client.hub.join(self.key, None, within=self.client.leases_range)
        try:
            while True:
                state, as_of = await subscription.next()
                kv = self.client.newest(self.key, state.get(self.key), as_of)
                yield self._record(kv)
        finally:
            self.client.hub.leave(subscription)

    async def close(self) -> None:
        """Nothing of its own: the watch stream belongs to the client."""

    # -- tests and operators ----------------------------------------------------------------

    async def delete_everything(self) -> None:
        """Delete the lease's key, term included (tests; an operator's ``etcdctl del``)."""
        await self.client.call("delete", "/v3/kv/deleterange", range_op(self.key))
        self.client.seen.pop(self.key, None)
