"""Many Leases on one connection: the Kubernetes `StoreClient`.

One `KubeApi` (one aiohttp session, one connection pool) serves every lease and the
candidate registry. How the leases are watched depends on how many there are:

* up to `PER_NAME_WATCH_LIMIT`: one watch per Lease, ``fieldSelector=metadata.name=<lease>``,
  exactly as a single-lease sidecar watches. RBAC can then name every Lease (list and watch
  honour ``resourceNames`` only for such a single-name request), and a Lease created by hand or
  by an older sidecar, without our label, is seen from the start. Each stream holds one of the
  pool's 100 connections, hence a small limit.
* more: one namespace watch by the label ``leader-sidecar/group=<group>``, fanned out by name
  (`fanout.SharedLeaseWatch`). It needs list/watch on every Lease of the namespace (RBAC cannot
  limit a label-selected list by name). A Lease without the label is invisible to it until a
  sidecar of this version writes it, and until then looks missing to the followers: they wait a
  full lease (rule 8) and their create is refused (409) with the Lease's real state — safe,
  only slower. Many-lease setups are new with this version, so such Leases are rare.

The mode is chosen from the configuration, not from how many leases happen to be open, so the
chart can render the matching Role (see charts/leader-sidecar/templates/rbac.yaml).
"""

from __future__ import annotations

import hashlib
import re

from sidecar.backends.kubernetes.candidates import KubernetesCandidates
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.fanout import SharedLeaseWatch
from sidecar.backends.kubernetes.reflector import CLIENT_GO, Pacing
from sidecar.backends.kubernetes.store import GROUP_LABEL, KubernetesLeaseStore
from sidecar.backends.kubernetes.watch import Selection
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.supervisor import Supervisor

PER_NAME_WATCH_LIMIT = 10
"""Up to this many leases per sidecar, one watch stream each (and RBAC by name); more share
one namespace watch. The chart's Role follows the same limit."""

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def group_label_value(group: str) -> str:
    """``group`` if it is a valid label value (at most 63 characters), else a short hash of it
    (a Lease name may be 253 characters long)."""
    if len(group) <= 63 and _LABEL_VALUE.fullmatch(group):
        return group
    return "g" + hashlib.sha256(group.encode()).hexdigest()[:40]


class KubernetesStoreClient:
    """The leases of one namespace through one API client; see the module docstring."""

    def __init__(
        self,
        namespace: str,
        *,
        api: KubeApi,
        group: str,
        shared_watch: bool,
        default_duration: float = 15.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_timeout: float = 60.0,
        supervisor: Supervisor | None = None,
        pacing: Pacing = CLIENT_GO,
    ) -> None:
        self.namespace = namespace
        self.api = api
        self.group = group
        self.default_duration = default_duration
        self.watch_timeout = watch_timeout
        self._clock = clock
        self._pacing = pacing  # how every watch of this client waits after failures
        self._labels = {GROUP_LABEL: group_label_value(group)}
        self._shared: SharedLeaseWatch | None = None
        if shared_watch:
            selector = f"{GROUP_LABEL}={self._labels[GROUP_LABEL]}"
            self._shared = SharedLeaseWatch(
                api,
                Selection(namespace, label_selector=selector),
                watch_timeout=watch_timeout,
                supervisor=supervisor,
                pacing=pacing,
            )

    @property
    def description(self) -> str:
        return f"kubernetes namespace={self.namespace} group={self.group} ({self.api.server})"

    def lease(self, name: str) -> KubernetesLeaseStore:
        return KubernetesLeaseStore(
            self.namespace,
            name,
            api=self.api,
            default_duration=self.default_duration,
            clock=self._clock,
            watch_timeout=self.watch_timeout,
            labels=self._labels,
            shared_watch=self._shared,
            owns_api=False,
            pacing=self._pacing,
        )

    def candidates(self, group: str) -> KubernetesCandidates:
        return KubernetesCandidates(
            self.api,
            self.namespace,
            group,
            clock=self._clock,
            watch_timeout=self.watch_timeout,
            pacing=self._pacing,
        )

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()
        await self.api.close()
