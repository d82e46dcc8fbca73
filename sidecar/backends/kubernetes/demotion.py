"""Demoting the pod on Kubernetes: the role label and the Events.

Role label (``leader-sidecar/role`` by default, ``--role-label-key``): on every transition this
pod is labelled ``leader`` or ``follower``. The new leader first relabels the previous holder's
pod ``follower`` (its pod name is the identity before the last ``_``) and then labels itself
``leader``, so a Service selecting ``role=leader`` reaches one pod even when the old sidecar
died without demoting itself. Labels are JSON merge patches of ``metadata.labels`` only.

Events: one core/v1 Event per transition, about the Lease (``involvedObject``), with this pod
as ``related``. The Lease is the subject because leadership is a property of the Lease: every
replica's transitions land in one timeline (``kubectl describe lease NAME``, or
``kubectl get events --field-selector involvedObject.name=NAME``), as client-go's leader
election records them. Renewal gaps past half the lease are Warning Events too.

Both are best effort, retried as client-go retries a request (`retried`): ``/leader`` already
answered 503 before any of this runs, and a failed label never blocks the election. While the
sidecar's store probe says the API server refuses (`sidecar.probe`), they are tried once and not
retried: a sidecar whose 16 leases all step down in an outage would otherwise retry 32 Events
(each lease's Event and renewal-gap Event) for minutes against an API server that is already
failing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sidecar.backends.kubernetes.client import MERGE_PATCH, CallError, KubeApi, Time, core_path
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log
from sidecar.status import GapAlert, Role, Transition

logger = logging.getLogger("sidecar.kubernetes")

COMPONENT = "leader-sidecar"
REASON = "LeaderElection"  # client-go's reason, so existing queries find ours too
GAP_REASON = "LeaseRenewalGap"
APP_DOWN_REASON = "AppDownNoSuccessor"
RETRIES = 10
"""Tries after the first, at most (client-go's REST client: 10)."""
FIRST_DELAY = 0.1
MAX_DELAY = 5.0
Sleep = Callable[[float], Awaitable[None]]
Refusing = Callable[[], bool]
"""Whether the sidecar's store probe says the API server refuses (then: no retries)."""


def never() -> bool:
    return False


_STOPPED = {
    "lost": ("Warning", "another replica holds the lease now, or it was deleted"),
    "deadline": (
        "Warning",
        "no renewal was confirmed before its deadline (API slow or unreachable)",
    ),
    "released": ("Normal", "released on request"),
    "shutdown": ("Normal", "released on shutdown"),
    "app_down": ("Warning", "handed over: this pod's app is down"),
    "drain": ("Normal", "handed over on shutdown once the app had stopped"),
    "hold": ("Warning", "stopped by an operator's hold (leader-sidecar hold)"),
}


def pod_of(identity: str | None) -> str | None:
    """The pod name inside an identity ``<pod>_<suffix>``."""
    if not identity or "_" not in identity or "/" in identity:
        return None  # (a loss marker or an operator's hold: no pod)
    return identity.rpartition("_")[0] or None


async def retried(
    call: Callable[[], Awaitable[Any]],
    *,
    sleep: Sleep = asyncio.sleep,
    rng: random.Random | None = None,
    refusing: Refusing = never,
) -> Any:
    """``call``, tried again after a transient failure (no answer, 429, 5xx) up to `RETRIES`
    times; other failures, and the last, raise at once, as does any failure while the store
    is ``refusing`` (the sidecar's one probe asks for everyone then). Each wait doubles from
    `FIRST_DELAY` up to `MAX_DELAY`, is never shorter than the server's ``Retry-After``, and is
    jittered by up to one more step, so sidecars throttled together do not come back together.
    The action's own timeout (`sidecar.demotion.ActionRunner`) bounds the whole."""
    uniform = (rng or random.Random()).uniform
    for attempt in range(RETRIES + 1):
        try:
            return await call()
        except CallError as error:
            if not error.transient or attempt == RETRIES or refusing():
                raise
            step = min(MAX_DELAY, FIRST_DELAY * 2**attempt)
            await sleep(max(step, error.retry_after or 0.0) + uniform(0.0, step))
    raise AssertionError("unreachable")


class PodRoleLabel:
    """Labels this pod (and, on becoming leader, the previous holder's pod)."""

    name = "pod-role-label"
    after_release = True  # (see `sidecar.demotion`)

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        pod_name: str,
        key: str,
        previous_holder: Callable[[], str | None] = lambda: None,
        sleep: Sleep = asyncio.sleep,
        refusing: Refusing = never,
    ) -> None:
        self.api = api
        self._sleep = sleep
        self._refusing = refusing
        self.namespace = namespace  # the pods', which may differ from the Lease's
        self.pod_name = pod_name
        self.key = key
        # Who held the lease before, as the store saw it: also known when the old leader
        # released it first (its own "follower" label may not have made it to the API).
        self.previous_holder = previous_holder

    async def __call__(self, transition: Transition) -> None:
        if transition.role is Role.LEADER:
            previous = pod_of(transition.previous_holder or self.previous_holder())
            if previous and previous != self.pod_name:
                await self.label(previous, "follower", missing_ok=True)
            await self.label(self.pod_name, "leader")
        else:
            await self.label(self.pod_name, "follower")

    async def label(self, pod: str, role: str, *, missing_ok: bool = False) -> None:
        patch = {"metadata": {"labels": {self.key: role}}}
        try:
            await retried(
                lambda: self.api.request(
                    "label pod",
                    "PATCH",
                    core_path(self.namespace, "pods", pod),
                    body=patch,
                    content_type=MERGE_PATCH,
                ),
                sleep=self._sleep,
                refusing=self._refusing,
            )
        except CallError as error:
            if error.status == 404 and missing_ok:
                log(logger, "info", "previous leader's pod is gone; nothing to relabel", pod=pod)
                return
            if error.status == 404:
                raise RuntimeError(
                    f"pod {self.namespace}/{pod} not found: set POD_NAME (or --pod-name) from "
                    "the downward API (fieldRef: metadata.name)"
                ) from None
            raise RuntimeError(
                f"could not label pod {self.namespace}/{pod} {role}: {error}"
            ) from None
        log(logger, "info", "labelled pod", pod=pod, label=f"{self.key}={role}")


class LeaseEvents:
    """Records a core/v1 Event about the Lease for every transition and renewal gap."""

    name = "kubernetes-event"
    after_release = True

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        lease: str,
        identity: str,
        pod_name: str | None,
        lease_uid: Callable[[], str | None],
        clock: Clock = SYSTEM_CLOCK,
        pod_namespace: str | None = None,
        sleep: Sleep = asyncio.sleep,
        refusing: Refusing = never,
        leases: Mapping[str, tuple[str, Callable[[], str | None]]] | None = None,
    ) -> None:
        self.api = api
        self._sleep = sleep
        self._refusing = refusing
        # Several leases (``--lease a,b``, ``--shards``): each transition's Event names the
        # Lease it is about — by the name users see (``namespace/name``): (Lease name, uid).
        self._leases = dict(leases or {})
        self.namespace = namespace  # the Lease's, and so the Events'
        self.pod_namespace = pod_namespace or namespace
        self.lease = lease
        self.identity = identity
        self.pod_name = pod_name
        self.lease_uid = lease_uid
        self.clock = clock

    async def __call__(self, transition: Transition) -> None:
        term = transition.status.term
        about = transition.status.lease
        if transition.role is Role.LEADER:
            previous = transition.previous_holder or "none"
            message = f"{self.identity} became leader (term {term}; previous holder: {previous})"
            await self.record("Normal", REASON, message, "Acquired", about=about)
            return
        kind, why = _STOPPED.get(transition.reason, ("Warning", transition.reason))
        message = f"{self.identity} stopped leading (term {term}): {why}"
        await self.record(kind, REASON, message, "Stopped", about=about)

    async def gap(self, alert: GapAlert) -> None:
        state = "still growing" if alert.growing else "then renewed"
        message = (
            f"{self.identity}: {alert.gap:.2f}s without a confirmed renewal on a "
            f"{alert.lease_duration:g}s lease ({state})"
        )
        if alert.last_error:
            message += f"; last error: {alert.last_error}"
        try:
            await self.record(
                "Warning", GAP_REASON, message[:1024], "RenewalGap", about=alert.status.lease
            )
        except Exception as exc:
            log(logger, "warning", "could not record the renewal-gap Event", error=str(exc))

    async def app_alone(self, lease: str, why: str | None) -> None:
        """A Warning Event: this replica leads ``lease`` with its app down, and no other
        replica's app is up to hand it to (leadership follows the app)."""
        message = (
            f"{self.identity} keeps leading with its app down: no other replica's app is up "
            "to hand the lease to"
        )
        if why:
            message += f"; the app: {why}"
        try:
            await self.record("Warning", APP_DOWN_REASON, message[:1024], "AppDown", about=lease)
        except Exception as exc:
            log(logger, "warning", "could not record the app-down Event", error=str(exc))

    async def record(
        self, kind: str, reason: str, message: str, action: str, *, about: str | None = None
    ) -> None:
        """``about``: the lease as users see it; the sidecar's first lease when not one of
        ``leases``."""
        lease, lease_uid = self._leases.get(about or "", (self.lease, self.lease_uid))
        now = Time.at(self.clock.wall()).isoformat()
        involved: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "name": lease,
            "namespace": self.namespace,
        }
        uid = lease_uid()
        if uid:
            involved["uid"] = uid
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{lease}.{time.time_ns():x}", "namespace": self.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "action": action,
            "source": {"component": COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity[:128],
        }
        if self.pod_name:
            event["related"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.pod_name,
                "namespace": self.pod_namespace,
            }
        try:
            await retried(
                lambda: self.api.request(
                    "create event", "POST", core_path(self.namespace, "events"), body=event
                ),
                sleep=self._sleep,
                refusing=self._refusing,
            )
        except CallError as error:
            raise RuntimeError(f"could not record the Event '{message}': {error}") from None
