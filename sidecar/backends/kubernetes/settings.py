"""The Kubernetes store's own settings: the kubeconfig (or none: the service account) and
the namespace its current context names."""

from __future__ import annotations

import dataclasses

from sidecar.backends.description import StoreConfig, StoreSettings


@dataclasses.dataclass(frozen=True)
class KubernetesSettings(StoreSettings):
    """``Config.store_settings`` with this store."""

    kubeconfig: str | None = None
    """``--kubeconfig``, else ``KUBECONFIG``; None: the pod's service account."""
    context_namespace: str | None = None
    """The kubeconfig's current context's namespace, as kubectl would use it."""
    source: str = "--kubeconfig"
    """Where the kubeconfig was named: ``--kubeconfig`` or ``KUBECONFIG``."""
    read: bool = True
    """False: the kubeconfig is yet to be read and checked (with the client: the namespace
    was given, so the configuration did not need it)."""

    @property
    def namespace(self) -> str | None:
        return self.context_namespace


def kubeconfig_of(config: StoreConfig) -> str | None:
    """The kubeconfig to use; None: the pod's service account."""
    found = config.store_settings
    return found.kubeconfig if isinstance(found, KubernetesSettings) else None
