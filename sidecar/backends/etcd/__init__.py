"""The etcd store: one key per lease, written only by conditional ``Txn``s, its expiry observed
by the followers (never an etcd lease's TTL), watched from the revision read.

Through etcd's gRPC gateway (JSON over HTTP on the client port, every etcd since 3.4) with
aiohttp: no gRPC library. The guarantees, the layout and the operations are in docs/etcd.md.

* `description` — the store as the sidecar knows it: its URLs, the ``--etcd-*`` options.
* `target` — the ``--store`` URL and the ``--etcd-*`` flags, checked at start-up.
* `api` — the gateway: endpoints and failover, deadlines, the auth token, the revisions seen.
* `records` — the keys, the values and the records they decode to.
* `client` — one client for every lease of a sidecar: requests, the epoch, what was seen.
* `watch` — the watch streams the leases and candidate groups share.
* `store` — one lease: the contract's requests and its watch.
* `candidates` — the candidate registry of a group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.description import StoreConfig
    from sidecar.backends.etcd.client import EtcdLeaseStore, EtcdStoreClient
    from sidecar.backends.etcd.store import EtcdLease
    from sidecar.backends.etcd.target import EtcdTarget, parse_target
    from sidecar.supervisor import Supervisor

_LAZY = {
    "EtcdStoreClient": "sidecar.backends.etcd.client",
    "EtcdLease": "sidecar.backends.etcd.store",
    "EtcdLeaseStore": "sidecar.backends.etcd.client",
    "EtcdTarget": "sidecar.backends.etcd.target",
    "parse_target": "sidecar.backends.etcd.target",
}

__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "EtcdLease",
    "EtcdLeaseStore",
    "EtcdStoreClient",
    "EtcdTarget",
    "open_etcd_client",
    "open_etcd_store",
    "parse_target",
]


def target_of(config: StoreConfig) -> EtcdTarget:
    """The cluster of ``--store etcd://…`` or ``etcds://…`` and the ``--etcd-*`` flags; its
    TLS files are loaded now, so a wrong one stops the sidecar at start-up."""
    from sidecar.backends.etcd.target import parse_target, settings_of

    settings = settings_of(config)
    target = parse_target(config.store, **settings.flags())
    target.ssl_context()
    return target


def open_etcd_client(config: StoreConfig, supervisor: Supervisor | None = None) -> EtcdStoreClient:
    """The client shared by every lease of the sidecar; its watch streams run under
    ``supervisor``."""
    from sidecar.backends.etcd.client import EtcdStoreClient

    timing = config.timing
    return EtcdStoreClient(
        target_of(config),
        request_timeout=timing.request_timeout,
        # A quiet stream is checked once a renewal interval would have spoken (at most every
        # 5 s), and listed again after a few leases of silence.
        probe_every=max(0.5, min(5.0, timing.renew_interval)),
        silence=max(10.0, 3 * timing.lease_duration),
        supervisor=supervisor,
    )


def open_etcd_store(config: StoreConfig) -> EtcdLeaseStore:
    """The store of ``--lease`` alone, on a client of its own."""
    from sidecar.backends.etcd.client import EtcdLeaseStore

    return EtcdLeaseStore(
        target_of(config), config.lease, request_timeout=config.timing.request_timeout
    )
