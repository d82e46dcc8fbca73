"""The ZooKeeper store: one persistent znode per lease, written only by conditional
``setData``/``create``, its expiry observed by the followers (never a session's timeout),
followed through one persistent recursive watch per sidecar.

Through a client of our own over ZooKeeper's wire protocol, on asyncio: no library (the
measurements that chose it are in docs/zookeeper.md).

* `description` — the store as the sidecar knows it: its URL.
* `target` — the ``--store`` URL, checked at start-up.
* `jute` — the wire format: the records sent and read.
* `session` — one session: connect, pings, requests, events, reconnects, expiry.
* `client` — one client for every lease of a sidecar: the epoch, what was seen, the watch.
* `store` — one lease: the contract's requests and its watch.
* `candidates` — the candidate registry of a group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.description import StoreConfig
    from sidecar.backends.zookeeper.client import ZooKeeperLeaseStore, ZooKeeperStoreClient
    from sidecar.backends.zookeeper.store import ZooKeeperLease
    from sidecar.backends.zookeeper.target import ZooKeeperTarget, parse_target

_LAZY = {
    "ZooKeeperStoreClient": "sidecar.backends.zookeeper.client",
    "ZooKeeperLease": "sidecar.backends.zookeeper.store",
    "ZooKeeperLeaseStore": "sidecar.backends.zookeeper.client",
    "ZooKeeperTarget": "sidecar.backends.zookeeper.target",
    "parse_target": "sidecar.backends.zookeeper.target",
}

__getattr__ = lazy_names(__name__, _LAZY)

__all__ = [
    "ZooKeeperLease",
    "ZooKeeperLeaseStore",
    "ZooKeeperStoreClient",
    "ZooKeeperTarget",
    "open_zookeeper_client",
    "open_zookeeper_store",
    "parse_target",
]


def open_zookeeper_client(config: StoreConfig) -> ZooKeeperStoreClient:
    """The client shared by every lease of the sidecar."""
    from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
    from sidecar.backends.zookeeper.target import target_of

    return ZooKeeperStoreClient(target_of(config), request_timeout=config.timing.request_timeout)


def open_zookeeper_store(config: StoreConfig) -> ZooKeeperLeaseStore:
    """The store of ``--lease`` alone, on a client of its own."""
    from sidecar.backends.zookeeper.client import ZooKeeperLeaseStore
    from sidecar.backends.zookeeper.target import target_of

    return ZooKeeperLeaseStore(
        target_of(config), config.lease, request_timeout=config.timing.request_timeout
    )
