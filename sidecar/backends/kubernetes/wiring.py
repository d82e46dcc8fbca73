"""Opening the Kubernetes store from the configuration, and its transition actions: the API
(kubeconfig or service account, proxy checked at start), the store of one lease or the client
of many, the pod role label and the Events."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from sidecar.backends.kubernetes.client import SERVICE_ACCOUNT_TOKEN, KubeApi, in_cluster
from sidecar.backends.kubernetes.settings import kubeconfig_of
from sidecar.backends.kubernetes.store import KubernetesLeaseStore
from sidecar.backends.kubernetes.store_client import PER_NAME_WATCH_LIMIT, KubernetesStoreClient
from sidecar.config_error import ConfigError
from sidecar.logs import log
from sidecar.service_account import SERVICE_ACCOUNT_DIR

if TYPE_CHECKING:
    from sidecar.backends.base import LeaseStore
    from sidecar.backends.description import StoreConfig
    from sidecar.backends.kubernetes.demotion import LeaseEvents
    from sidecar.demotion import Action
    from sidecar.status import GapAlert
    from sidecar.supervisor import Supervisor

logger = logging.getLogger("sidecar.kubernetes")


def _api(config: StoreConfig) -> KubeApi:
    """The API of ``--store kubernetes``: the kubeconfig if one is given (``--kubeconfig`` or
    ``KUBECONFIG``), else the pod's service account."""
    if not kubeconfig_of(config) and not in_cluster():
        raise ConfigError(
            "--store",
            config.store,
            "not running in a Kubernetes pod (no KUBERNETES_SERVICE_HOST or no service account "
            f"token at {SERVICE_ACCOUNT_TOKEN}); give --kubeconfig or KUBECONFIG to run outside "
            "a cluster",
        )
    _check_proxy(config)
    return KubeApi(kubeconfig_of(config), config.timing.request_timeout)


def _check_proxy(config: StoreConfig) -> None:
    """A proxy variable that applies to the API server and cannot be used (a SOCKS proxy)
    stops the sidecar at start, as a bad kubeconfig does, not at its first request."""
    from sidecar.backends.kubernetes.kubeconfig import Kubeconfig, KubeconfigError
    from sidecar.backends.kubernetes.proxy import ProxyError, from_environment

    path = kubeconfig_of(config)
    try:
        if path:
            kubeconfig = Kubeconfig.read(path)
            if kubeconfig.proxy() is not None:
                return  # the kubeconfig's proxy-url wins
            server = str(kubeconfig.cluster.fields["server"])
        else:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            host = f"[{host}]" if ":" in host else host
            server = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        from_environment(server, os.environ)
    except ProxyError as exc:
        raise ConfigError(exc.setting, exc.value, exc.reason) from None
    except KubeconfigError as exc:
        raise ConfigError("--kubeconfig", path, str(exc)) from None


def open_kubernetes_store(config: StoreConfig) -> KubernetesLeaseStore:
    """The store of the one lease ``--lease``, with a client of its own."""
    return KubernetesLeaseStore(
        config.namespace,
        config.lease,
        api=_api(config),
        default_duration=config.timing.lease_duration,
    )


def served_leases(config: StoreConfig) -> tuple[str, int]:
    """(group, number of Leases) this sidecar serves: ``--lease a,b`` times ``--shards N``,
    group ``--group`` or the first lease."""
    return config.candidate_group, len(config.lease_names)


def open_kubernetes_client(
    config: StoreConfig, supervisor: Supervisor | None = None
) -> KubernetesStoreClient:
    """One client for every lease of this sidecar; a shared namespace watch past
    `PER_NAME_WATCH_LIMIT` leases (see store_client.py), run under ``supervisor``."""
    group, count = served_leases(config)
    return KubernetesStoreClient(
        config.namespace,
        api=_api(config),
        group=group,
        shared_watch=count > PER_NAME_WATCH_LIMIT,
        default_duration=config.timing.lease_duration,
        supervisor=supervisor,
    )


def pod_namespace(config: StoreConfig) -> str:
    """The pods' namespace: ``POD_NAMESPACE`` (downward API), else the service account's, else
    the Lease's. A Lease may live in another namespace than the pods (``--namespace``)."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or config.namespace
    except OSError:
        return config.namespace


def _api_of(config: StoreConfig, store: LeaseStore) -> tuple[KubeApi, Callable[[], str | None]]:
    if isinstance(store, KubernetesLeaseStore):
        return store.api, lambda: store.uid
    # A store injected by a test: same API server, its own client.
    return KubeApi(kubeconfig_of(config), config.timing.request_timeout), lambda: None


def _previous_holder(store: LeaseStore) -> Callable[[], str | None]:
    if isinstance(store, KubernetesLeaseStore):
        return lambda: store.previous_holder
    return lambda: None


def demotion_actions(
    config: StoreConfig,
    store: LeaseStore,
    refusing: Callable[[], bool] = lambda: False,
    stores: Mapping[str, LeaseStore] | None = None,
    *,
    role_label_key: str | None = None,
) -> list[Action]:
    """Relabel pods, then record the Event, on every transition; not retried while
    ``refusing`` (the sidecar's store probe says the API server refuses). ``stores``: every
    lease's store by the name users see, so that each Event names its own Lease.
    ``role_label_key``: instead of the configured one ("": label nothing)."""
    from sidecar.backends.kubernetes.demotion import PodRoleLabel

    api, lease_uid = _api_of(config, store)
    actions: list[Action] = []
    label_key = config.role_label_key if role_label_key is None else role_label_key
    if label_key and config.pod_name:
        actions.append(
            PodRoleLabel(
                api,
                pod_namespace(config),
                config.pod_name,
                label_key,
                _previous_holder(store),
                refusing=refusing,
            )
        )
    else:
        log(
            logger,
            "info",
            "not labelling pods with their role",
            why="--role-label-key is empty" if not label_key else "POD_NAME is not set",
            hint="set POD_NAME from the downward API (fieldRef: metadata.name)",
        )
    actions.append(_lease_events(config, api, lease_uid, refusing, stores))
    return actions


def gap_alert_listener(
    config: StoreConfig,
    store: LeaseStore,
    refusing: Callable[[], bool] = lambda: False,
    stores: Mapping[str, LeaseStore] | None = None,
) -> Callable[[GapAlert], Awaitable[None]]:
    """A Warning Event for each renewal gap past half the lease."""
    return _lease_events(config, *_api_of(config, store), refusing, stores).gap


def app_alone_listener(
    config: StoreConfig,
    store: LeaseStore,
    refusing: Callable[[], bool] = lambda: False,
    stores: Mapping[str, LeaseStore] | None = None,
) -> Callable[[str, str | None], Awaitable[None]]:
    """A Warning Event for a lease led with the app down and no other app up."""
    return _lease_events(config, *_api_of(config, store), refusing, stores).app_alone


def _lease_events(
    config: StoreConfig,
    api: KubeApi,
    lease_uid: Callable[[], str | None],
    refusing: Callable[[], bool],
    stores: Mapping[str, LeaseStore] | None,
) -> LeaseEvents:
    from sidecar.backends.kubernetes.demotion import LeaseEvents

    leases = {
        shown: (store.name, _uid_of(store))
        for shown, store in (stores or {}).items()
        if isinstance(store, KubernetesLeaseStore)
    }
    return LeaseEvents(
        api,
        config.namespace,
        config.lease,
        config.identity,
        config.pod_name,
        lease_uid,
        pod_namespace=pod_namespace(config),
        refusing=refusing,
        leases=leases,
    )


def _uid_of(store: KubernetesLeaseStore) -> Callable[[], str | None]:
    return lambda: store.uid
