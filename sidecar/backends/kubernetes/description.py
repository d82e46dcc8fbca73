"""The Kubernetes store as the rest of the sidecar knows it (`sidecar.backends.description`):
``--store kubernetes``, the ``--kubeconfig`` option, the namespace a kubeconfig context names,
and the store's transition actions (the pod role label and the Events)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import Store, StoreConfig, WrongForm, check_files
from sidecar.config_error import ConfigError
from sidecar.options import Option, parse_text

if TYPE_CHECKING:
    from sidecar.backends.actions import ActionsContext, StoreActions
    from sidecar.backends.base import StoreClient
    from sidecar.backends.kubernetes.settings import KubernetesSettings
    from sidecar.supervisor import Supervisor

NAME = "kubernetes"
EXEC_EXTRA = "pip install 'leader-sidecar[kubeconfig-exec]'"

OPTIONS = (
    Option(
        "--kubeconfig",
        parse_text,
        "kubeconfig file outside a cluster (default KUBECONFIG, else in-cluster service "
        "account); one whose user runs an exec plugin or auth-provider needs the "
        f"[kubeconfig-exec] extra: {EXEC_EXTRA}",
        "PATH",
    ),
)


def check_url(url: str) -> str:
    if url != NAME:
        raise WrongForm()
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_files(values, "kubeconfig")


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> KubernetesSettings:
    from sidecar.backends.kubernetes.settings import KubernetesSettings

    kubeconfig = values.get("kubeconfig") or environ.get("KUBECONFIG") or None
    if kubeconfig is None:
        return KubernetesSettings()
    source = "--kubeconfig" if values.get("kubeconfig") else "KUBECONFIG"
    if values.get("namespace") or environ.get("POD_NAMESPACE"):
        # The namespace is given: the kubeconfig is read with the client, once the listeners
        # answer (its YAML costs ~20 ms of imports), and a bad one stops the sidecar then.
        return KubernetesSettings(kubeconfig, source=source, read=False)
    return KubernetesSettings(kubeconfig, _kubeconfig_namespace(source, kubeconfig), source)


def _kubeconfig_namespace(source: str, kubeconfig: str) -> str | None:
    """The current context's namespace (what kubectl would use), read now so that a kubeconfig
    that cannot work stops the sidecar at start with its reason, not later as a store that
    never answers."""
    from sidecar.backends.kubernetes.kubeconfig import Kubeconfig, KubeconfigError

    try:
        config = Kubeconfig.read(kubeconfig)
    except KubeconfigError as exc:
        raise ConfigError(source, kubeconfig, str(exc)) from None
    if reason := config.plugin_unavailable():
        raise ConfigError(source, kubeconfig, reason)
    return config.namespace


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    """Raises `ConfigError` for a kubeconfig that cannot work, as the configuration does when
    it reads it (`settings`)."""
    from sidecar.backends.kubernetes.settings import KubernetesSettings

    settings = config.store_settings
    if isinstance(settings, KubernetesSettings) and settings.kubeconfig and not settings.read:
        _kubeconfig_namespace(settings.source, settings.kubeconfig)
    from sidecar.backends.kubernetes.wiring import open_kubernetes_client

    return open_kubernetes_client(config, supervisor)


def actions(context: ActionsContext) -> StoreActions:
    """Relabel pods and record Events on every transition; a Warning Event for a renewal gap
    and for a lease led with the app down and nobody to take it."""
    from sidecar.backends.actions import StoreActions
    from sidecar.backends.kubernetes.wiring import (
        app_alone_listener,
        demotion_actions,
        gap_alert_listener,
    )

    config, store, refusing, stores = (
        context.config,
        context.store,
        context.refusing,
        context.stores,
    )
    # One pod label cannot say which of several leases a pod leads: label nothing, record
    # the Events (each names its lease).
    label_key = config.role_label_key if len(config.lease_names) == 1 else ""
    return StoreActions(
        on_transition=demotion_actions(config, store, refusing, stores, role_label_key=label_key),
        on_gap_alert=gap_alert_listener(config, store, refusing, stores),
        on_app_alone=app_alone_listener(config, store, refusing, stores),
    )


KUBERNETES = Store(
    name=NAME,
    schemes=(NAME,),
    forms=NAME,
    shown=NAME,
    example=NAME,
    check_url=check_url,
    open_client=open_client,
    options=OPTIONS,
    option_prefix="kubeconfig",
    check_options=check_options,
    settings=settings,
    lease_required="is required with the kubernetes store: the name of the Lease object, "
    "e.g. --lease my-app",
    namespaced=True,
    extras=(("a --kubeconfig with an exec plugin", EXEC_EXTRA),),
    actions=actions,
)
