"""The candidate registry of a group: one Lease, ``<group>-candidates``, one annotation per
replica.

Why one Lease with annotations rather than one Lease per replica: the chart's Role names every
Lease the sidecar may touch, and replicas' names are not known at render time (a Lease per
replica would need get/patch on every Lease in the namespace). One Lease per group has a name
the chart knows, and ``kubectl get lease <group>-candidates -o yaml`` shows the whole group.

Each replica writes only its own key, ``candidates.leader-sidecar.io/<hash of identity>``,
with a JSON merge patch, so no resourceVersion precondition is needed: writers never touch each
other's keys, and the API server applies each patch atomically to the latest object. A
``null`` deletes the key (`leave`). The value is JSON with the `Candidate` fields and a random
``version``, new on every beat: readers judge liveness by watching versions change (rule 2).

Garbage collection (only that: never liveness) drops entries whose wall-clock ``beat`` is more
than `GC_LEASES` leases old, in a merge patch conditional on the resourceVersion it was decided
from, so a replica that beat in between keeps its entry. The API server caps all annotations of
an object at 256 KiB together: about a thousand replicas per group.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import Candidate
from sidecar.backends.kit import candidate_json
from sidecar.backends.kit.candidate_json import candidate_object
from sidecar.backends.kit.versions import new_version
from sidecar.backends.kubernetes.client import MERGE_PATCH, CallError, KubeApi, lease_path
from sidecar.backends.kubernetes.reflector import CLIENT_GO, Listed, Pacing, Reflector
from sidecar.backends.kubernetes.watch import Selection, unavailable
from sidecar.clock import SYSTEM_CLOCK, Clock

KEY_PREFIX = "candidates.leader-sidecar.io/"
GC_LEASES = 20
"""Entries not beaten for this many leases (wall clock) are removed."""


def candidates_lease_name(group: str) -> str:
    return f"{group}-candidates"


def annotation_key(identity: str) -> str:
    """A valid annotation name for any identity (at most 63 characters after the prefix)."""
    return KEY_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:16]


def encode(candidate: Candidate, version: str, beat_at: datetime) -> str:
    return candidate_json.encode(candidate_object(candidate, version, beat_at, beat_field="beat"))


def decode(key: str, value: object) -> Candidate:
    """The candidate in the annotation ``key``, checked (`sidecar.backends.records`): one
    that is not ours (hand-edited, or under another identity's key) is left out."""
    candidate = candidate_json.decode(key, value, beat_field="beat")
    if candidate.unreadable is None and annotation_key(candidate.identity) != key:
        problem = f"identity {candidate.identity!r} written under another identity's key"
        return records.unreadable_candidate(key, candidate.version, problem)
    return candidate


def _annotations(lease: dict[str, Any] | None) -> dict[str, Any]:
    return ((lease or {}).get("metadata") or {}).get("annotations") or {}


def _records(lease: dict[str, Any] | None) -> list[Candidate]:
    annotations = _annotations(lease).items()
    return [decode(key, value) for key, value in annotations if key.startswith(KEY_PREFIX)]


class KubernetesCandidates:
    """The candidates of ``group`` in the Lease ``<group>-candidates`` of ``namespace``."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        group: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        gc_every: float = 60.0,
        watch_timeout: float = 60.0,
        rng: random.Random | None = None,
        pacing: Pacing = CLIENT_GO,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.group = group
        self.name = candidates_lease_name(group)
        self._clock = clock
        self._gc_every = gc_every  # monotonic seconds between garbage collections
        self._last_gc = float("-inf")
        self.watch_timeout = watch_timeout
        self._rng = rng or random.Random()
        self._pacing = pacing
        self._reflector: Reflector | None = None  # while `changes` runs

    async def beat(self, candidate: Candidate, duration: float) -> None:
        """Write our own key only; create the Lease if the group has none yet."""
        beat_at = self._clock.wall()
        value = encode(candidate, candidate.version or new_version(), beat_at)
        annotations = {annotation_key(candidate.identity): value}
        try:
            await self._merge("beat candidate", {"metadata": {"annotations": annotations}})
        except CallError as error:
            if error.status != 404:
                raise unavailable(error, self.namespace) from None
            await self._create(annotations)
        if self._clock.now() - self._last_gc >= self._gc_every:
            self._last_gc = self._clock.now()
            await self._collect(beat_at - timedelta(seconds=GC_LEASES * duration))

    async def list(self) -> list[Candidate]:
        return _records(await self._get())

    async def leave(self, identity: str) -> None:
        patch = {"metadata": {"annotations": {annotation_key(identity): None}}}
        try:
            await self._merge("leave candidates", patch)
        except CallError as error:
            if error.status != 404:  # no registry: nothing to leave
                raise unavailable(error, self.namespace) from None

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """The group's Lease, listed and then watched (`Reflector`): every record at each
        change. Every beat is a change here, so the view stays current on versions too."""
        reflector = Reflector(
            self.api,
            Selection(self.namespace, field_selector=f"metadata.name={self.name}"),
            "candidates",
            watch_timeout=self.watch_timeout,
            pacing=self._pacing,
            rng=self._rng,
        )
        self._reflector = reflector
        try:
            async with contextlib.aclosing(reflector.events()) as events:
                async for event in events:
                    if isinstance(event, Listed):
                        yield _records(event.items[0] if event.items else None)
                    else:
                        yield _records(event.obj if event.kind != "DELETED" else None)
        finally:
            if self._reflector is reflector:
                self._reflector = None

    def following(self) -> bool:
        """Connected: after a failure, until the reflector lists (or resumes) again, a change
        may go unseen, and a hand-over reads the group first."""
        return self._reflector is not None and self._reflector.synced

    # -- requests ---------------------------------------------------------------------------

    async def _merge(self, op: str, patch: dict[str, Any]) -> Any:
        """A merge patch of the candidates Lease. Raises CallError."""
        return await self.api.request(
            op,
            "PATCH",
            lease_path(self.namespace, self.name),
            body=patch,
            content_type=MERGE_PATCH,
        )

    async def _get(self) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = await self.api.request(
                "list candidates", "GET", lease_path(self.namespace, self.name)
            )
        except CallError as error:
            if error.status == 404:
                return None
            raise unavailable(error, self.namespace) from None
        return lease

    async def _create(self, annotations: dict[str, str]) -> None:
        """The first beat of the group. A 409 AlreadyExists: another replica was first, and
        our key goes in with a patch after all."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": annotations,
            },
            "spec": {},
        }
        try:
            await self.api.request(
                "create candidates", "POST", lease_path(self.namespace), body=body
            )
        except CallError as error:
            if error.status != 409:
                raise unavailable(error, self.namespace) from None
            try:
                await self._merge("beat candidate", {"metadata": {"annotations": annotations}})
            except CallError as again:
                raise unavailable(again, self.namespace) from None

    async def _collect(self, older_than: datetime) -> None:
        """Remove entries beaten before ``older_than`` (wall clock; garbage collection only).
        Best effort: a lost race (409) or an error leaves them for the next round."""
        lease = await self._get()
        if lease is None:
            return
        stale: dict[str, None] = {}
        for key, value in _annotations(lease).items():
            candidate = decode(key, value) if key.startswith(KEY_PREFIX) else None
            beat_at = candidate.beat_at if candidate is not None else None
            if beat_at is not None and beat_at.tzinfo is not None and beat_at < older_than:
                stale[key] = None
        if not stale:
            return
        version = (lease.get("metadata") or {}).get("resourceVersion")
        metadata = {"resourceVersion": version, "annotations": stale}
        try:
            await self._merge("collect candidates", {"metadata": metadata})
        except CallError:
            return
