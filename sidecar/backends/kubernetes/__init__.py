"""The Kubernetes store: a ``coordination.k8s.io/v1`` Lease through a small REST client of our
own over aiohttp (`client`), plus what only Kubernetes can do on a transition: relabel pods and
record Events.

* `store` — the lease store (observe-based expiry, compare-and-swap, the watch).
* `store_client` — many leases on one connection; `fanout` — one watch for many Leases;
  `candidates` — the candidate registry.
* `reflector` — the one list-then-watch loop all three watches use (client-go's back-off,
  the "very short watch" rule, ``Retry-After``); `watch` — its requests.
* `client` — requests, deadlines, error mapping, MicroTime; `kubeconfig` — where the API server
  is and the credentials (service account or kubeconfig).
* `demotion` — the pod role label and the Events.
* `description` — the store as the sidecar knows it: ``--kubeconfig``, its actions;
  `wiring` — the API, the store and client, the actions, from the configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.kubernetes.store import KubernetesLeaseStore
    from sidecar.backends.kubernetes.store_client import KubernetesStoreClient
    from sidecar.backends.kubernetes.wiring import (
        app_alone_listener,
        demotion_actions,
        gap_alert_listener,
        open_kubernetes_client,
        open_kubernetes_store,
    )

_LAZY = {
    "KubernetesLeaseStore": "sidecar.backends.kubernetes.store",
    "KubernetesStoreClient": "sidecar.backends.kubernetes.store_client",
    "app_alone_listener": "sidecar.backends.kubernetes.wiring",
    "demotion_actions": "sidecar.backends.kubernetes.wiring",
    "gap_alert_listener": "sidecar.backends.kubernetes.wiring",
    "open_kubernetes_client": "sidecar.backends.kubernetes.wiring",
    "open_kubernetes_store": "sidecar.backends.kubernetes.wiring",
}

__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "KubernetesLeaseStore",
    "KubernetesStoreClient",
    "app_alone_listener",
    "demotion_actions",
    "gap_alert_listener",
    "open_kubernetes_client",
    "open_kubernetes_store",
]
