"""The lease as a ``coordination.k8s.io/v1`` Lease object.

Fields, so ``kubectl get lease`` reads naturally: ``holderIdentity`` (empty when released),
``leaseDurationSeconds`` (whole seconds, rounded up), ``acquireTime``/``renewTime`` (wall
clock, for humans only) and ``leaseTransitions`` = the term.

Compare-and-swap everywhere, on the resourceVersion this process last observed:

* acquire a missing Lease: POST (a 409 AlreadyExists means another candidate was first);
* acquire an existing one: PUT with the observed resourceVersion;
* renew and release: a JSON merge patch that carries ``metadata.resourceVersion``. The API
  server checks it exactly like a PUT's (409 when stale), but answers 404 for a deleted Lease
  where a PUT would silently re-create it (Leases allow create-on-update): a renewal must never
  resurrect a lease an operator deleted.

A 409 is never retried blindly: the store re-reads and reports what it found (`Conflict`, or
`NotOwned` when the lease is no longer ours).

The watch reports a deleted Lease as free at its last term (not as "no record"): nobody holds
it any more, so a leader stops at once, and the term carries on in every replica's
high-water mark, so the Lease is re-created with the next term.

Expiry is observe-based (DESIGN rule 2), as client-go does it: a candidate treats the Lease
as expired only after *this process* has seen the same resourceVersion unchanged for
``leaseDurationSeconds`` on its own monotonic clock. ``renewTime`` is never trusted, so clock
skew between hosts cannot shorten a lease; a process that has just started waits a full lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
from collections.abc import AsyncIterator
from typing import Any

from sidecar.backends.base import (
    Conflict,
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreBehind,
    StoreUnavailable,
)
from sidecar.backends.kubernetes.client import CallError, KubeApi, MicroTime
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log

logger = logging.getLogger("sidecar.kubernetes")

MERGE_PATCH = "application/merge-patch+json"


def whole_seconds(duration: float) -> int:
    """``leaseDurationSeconds`` is an int32: round up, so others never wait less than we hold."""
    return max(1, math.ceil(duration - 1e-9))


def _newer(candidate: str | None, current: str | None) -> bool:
    """Whether ``candidate`` is a later resourceVersion than ``current``. resourceVersions are
    opaque; every API server in practice uses etcd's revision (a decimal counter), and this is
    used only to keep a late watch event from replacing a fresher answer in a cache — never
    for a safety decision. Unknown formats count as newer."""
    if current is None or candidate is None:
        return True
    if candidate.isdigit() and current.isdigit():
        return int(candidate) >= int(current)
    return True


class KubernetesLeaseStore:
    """One Lease (``namespace/name``) in one Kubernetes API server."""

    def __init__(
        self,
        namespace: str,
        name: str,
        *,
        api: KubeApi,
        default_duration: float = 15.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_timeout: float = 60.0,
        rng: random.Random | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.api = api
        self.default_duration = default_duration
        self.watch_timeout = watch_timeout
        self._clock = clock
        self._rng = rng or random.Random()
        # What this process last saw of the Lease, and since when (monotonic) it has seen that
        # very resourceVersion: the whole basis of expiry (rule 2).
        self._lease: Any = None
        self._seen_version: str | None = None
        self._seen_at = 0.0
        self.uid: str | None = None
        # The last holder seen in any observation, and who held the lease before our latest
        # grant: the demotion actions relabel that pod, even when it released the lease first.
        self.last_holder: str | None = None
        self.previous_holder: str | None = None

    @property
    def description(self) -> str:
        return f"kubernetes lease={self.namespace}/{self.name} ({self.api.server})"

    # -- observing --------------------------------------------------------------------------

    def _observe(self, lease: Any) -> LeaseRecord | None:
        """Remember ``lease`` (None: it does not exist) and turn it into a record."""
        now = self._clock.now()
        if lease is None:
            self._lease = None
            self._seen_version = None
            return None
        version = str(lease.metadata.resource_version)
        if self._lease is not None and not _newer(version, self._seen_version):
            return self._record(lease, now)  # a late watch event: keep the fresher state
        if version != self._seen_version:
            self._seen_version = version
            self._seen_at = now
        self._lease = lease
        self.uid = lease.metadata.uid or self.uid
        record = self._record(lease, now)
        self.last_holder = record.holder or self.last_holder
        return record

    def _record(self, lease: Any, now: float) -> LeaseRecord:
        spec = lease.spec
        holder = (spec.holder_identity if spec else None) or None
        seconds = spec.lease_duration_seconds if spec else None
        duration = float(seconds) if seconds and seconds > 0 else self.default_duration
        if holder is None:
            expires_in = 0.0
        elif str(lease.metadata.resource_version) == self._seen_version:
            expires_in = max(0.0, self._seen_at + duration - now)
        else:
            expires_in = duration  # just seen for the first time
        return LeaseRecord(
            holder=holder,
            term=int((spec.lease_transitions if spec else None) or 0),
            duration=duration,
            expires_in=expires_in,
            version=str(lease.metadata.resource_version),
            acquired_at=spec.acquire_time if spec else None,
            renewed_at=spec.renew_time if spec else None,
        )

    def _deleted(self, lease: Any) -> LeaseRecord:
        """A Lease deleted under us (``kubectl delete lease``): nobody holds it any more, and
        its last term is still the floor for the next grant. Reported as free at that term, so
        a leader that sees it stops at once and followers create the Lease again above it."""
        self._observe(None)
        record = self._record(lease, self._clock.now())
        return dataclasses.replace(record, holder=None, expires_in=0.0)

    def _unavailable(self, error: CallError) -> StoreUnavailable:
        if error.status == 404 and error.reason == "NotFound" and "namespaces" in error.message:
            return StoreUnavailable(
                f"{error}; create namespace {self.namespace} or fix --namespace"
            )
        return StoreUnavailable(str(error))

    # -- requests ---------------------------------------------------------------------------

    async def _get(self) -> Any:
        """The Lease, or None if it does not exist. Raises StoreUnavailable."""
        coordination = await self._coordination()
        try:
            return await self.api.call(
                "get lease",
                lambda: coordination.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=self.api.request_timeout
                ),
            )
        except CallError as error:
            if error.status == 404:
                return None
            raise self._unavailable(error) from None

    async def _coordination(self) -> Any:
        try:
            return await self.api.coordination()
        except Exception as exc:
            raise StoreUnavailable(
                f"cannot load the Kubernetes client configuration: {exc}"
            ) from exc

    async def _reread(self) -> LeaseRecord | None:
        """After a lost compare-and-swap: what is there now (None if it cannot be read)."""
        try:
            return self._observe(await self._get())
        except StoreUnavailable:
            return None

    def _spec(self, identity: str, duration: float, term: int, acquired: bool) -> Any:
        from kubernetes.aio import client

        now = MicroTime.at(self._clock.wall())
        return client.V1LeaseSpec(
            holder_identity=identity,
            lease_duration_seconds=whole_seconds(duration),
            acquire_time=now if acquired else None,
            renew_time=now,
            lease_transitions=term,
        )

    async def _create(self, identity: str, duration: float, min_term: int) -> LeaseRecord:
        from kubernetes.aio import client

        coordination = await self._coordination()
        body = client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=self._spec(identity, duration, max(0, min_term) + 1, acquired=True),
        )
        try:
            created = await self.api.call(
                "create lease",
                lambda: coordination.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self.api.request_timeout
                ),
            )
        except CallError as error:
            if error.status == 409:  # AlreadyExists: another candidate created it first
                raise Conflict(
                    f"lease created concurrently: {error}", await self._reread()
                ) from None
            raise self._unavailable(error) from None
        record = self._observe(created)
        assert record is not None
        return record

    async def _patch(self, op: str, lease: Any, spec: dict[str, Any]) -> Any:
        """A merge patch conditional on ``lease``'s resourceVersion. Raises CallError for 404
        and 409, StoreUnavailable for everything else."""
        coordination = await self._coordination()
        patch = {"metadata": {"resourceVersion": lease.metadata.resource_version}, "spec": spec}
        try:
            return await self.api.call(
                op,
                lambda: coordination.patch_namespaced_lease(
                    self.name,
                    self.namespace,
                    patch,
                    _content_type=MERGE_PATCH,
                    _request_timeout=self.api.request_timeout,
                ),
            )
        except CallError as error:
            if error.status in (404, 409):
                raise
            raise self._unavailable(error) from None

    # -- the contract -----------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return self._observe(await self._get())

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        # 1. Read the Lease. Missing: create it, with a term above every term seen (rule 5) —
        #    unless terms were seen before: then it was deleted, and its holder may still lead.
        lease = await self._get()
        previous = self.last_holder
        if lease is None:
            self._observe(None)
            if min_term > 0 and not after_reset:
                raise StoreBehind(f"lease {self.namespace}/{self.name} was deleted", None)
            self.previous_holder = previous
            return await self._create(identity, duration, min_term)
        record = self._observe(lease)
        assert record is not None
        self.previous_holder = record.holder or previous
        # 2. Someone else's and not seen unchanged for a whole lease: held (rule 2).
        if record.holder is not None and record.holder != identity and record.expires_in > 0:
            raise LeaseHeld(f"held by {record.holder}", record)
        # 2b. A term below one seen before: the Lease was replaced or rewound (rule 5).
        if record.term < min_term and not after_reset:
            raise StoreBehind(
                f"lease {self.namespace}/{self.name} has term {record.term}, below {min_term}",
                record,
            )
        # 3. Free, expired by observation, or ours: take it with the next term, conditional
        #    on the resourceVersion we judged it by (rule 1).
        from kubernetes.aio import client

        coordination = await self._coordination()
        body = client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=lease.metadata,
            spec=self._spec(identity, duration, max(record.term, min_term) + 1, acquired=True),
        )
        try:
            written = await self.api.call(
                "acquire lease",
                lambda: coordination.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self.api.request_timeout
                ),
            )
        except CallError as error:
            if error.status == 409:
                # 4. Someone wrote since we read: never retry blindly, report what is there.
                raise Conflict(
                    f"lost the race for the lease: {error}", await self._reread()
                ) from None
            raise self._unavailable(error) from None
        granted = self._observe(written)
        assert granted is not None
        return granted

    async def _owned(self, identity: str, term: int) -> Any:
        """Our latest view of the Lease if it is ``identity``'s grant of ``term``; else
        NotOwned without writing anything."""
        lease = self._lease if self._lease is not None else await self._get()
        if lease is None:
            self._observe(None)
            raise NotOwned(f"lease {self.namespace}/{self.name} does not exist", None)
        record = self._record(lease, self._clock.now())
        if record.holder != identity or record.term != term:
            raise NotOwned(
                f"held by {record.holder} with term {record.term}, not {identity} with {term}",
                record,
            )
        return lease

    async def _after_failed_write(
        self, error: CallError, identity: str, term: int
    ) -> NotOwned | Conflict:
        if error.status == 404:
            self._observe(None)
            return NotOwned(f"lease {self.namespace}/{self.name} was deleted", None)
        try:
            fresh = self._observe(await self._get())
        except StoreUnavailable:  # nothing known: not a reason to give the lease up
            return Conflict(f"the lease was written concurrently: {error}", None)
        if fresh is None or fresh.holder != identity or fresh.term != term:
            return NotOwned(f"the lease changed hands: {error}", fresh)
        return Conflict(f"the lease was written concurrently: {error}", fresh)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        lease = await self._owned(identity, term)
        spec = self._spec(identity, duration, term, acquired=False)
        try:
            written = await self._patch(
                "renew lease",
                lease,
                {
                    "holderIdentity": identity,
                    "leaseDurationSeconds": spec.lease_duration_seconds,
                    "renewTime": spec.renew_time.isoformat(),
                    "leaseTransitions": term,
                },
            )
        except CallError as error:
            raise await self._after_failed_write(error, identity, term) from None
        record = self._observe(written)
        assert record is not None
        return record

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        lease = await self._owned(identity, term)
        try:
            written = await self._patch(
                "release lease",
                lease,
                # An empty holder keeps the term (leaseTransitions) and wakes every watcher.
                {"holderIdentity": "", "renewTime": MicroTime.at(self._clock.wall()).isoformat()},
            )
        except CallError as error:
            raise await self._after_failed_write(error, identity, term) from None
        return self._observe(written)

    # -- the watch --------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """List the one Lease, then watch it from that resourceVersion; resume from the last
        resourceVersion after a dropped connection, re-list after 410 Gone, back off while the
        API is unreachable. Never raises StoreError; runs until cancelled."""
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    lease, version = await self._list()
                    yield self._observe(lease)
                async for kind, lease, resume_at in self._stream(version):
                    failures = 0
                    version = resume_at
                    if kind == "DELETED":
                        yield self._deleted(lease)
                    elif kind in ("ADDED", "MODIFIED"):
                        yield self._observe(lease)
            except _Relist as relist:
                log(logger, "info", "lease watch expired; listing again", reason=str(relist))
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # CallError, StoreUnavailable, _WatchBroken, bad JSON, ...
                failures += 1
                delay = self._backoff(failures)
                log(
                    logger,
                    "warning" if failures in (3, 10) or failures % 50 == 0 else "debug",
                    "lease watch interrupted; reconnecting",
                    error=str(exc),
                    failures=failures,
                    retry_in_seconds=round(delay, 3),
                )
                await asyncio.sleep(delay)

    def _backoff(self, failures: int) -> float:
        base = min(2.0, 0.05 * 2.0 ** (failures - 1))
        return base * self._rng.uniform(0.5, 1.0)

    async def _list(self) -> tuple[Any, str]:
        coordination = await self._coordination()
        try:
            listed = await self.api.call(
                "list lease",
                lambda: coordination.list_namespaced_lease(
                    self.namespace,
                    field_selector=f"metadata.name={self.name}",
                    _request_timeout=self.api.request_timeout,
                ),
            )
        except CallError as error:
            raise self._unavailable(error) from None
        items = listed.items or []
        return (items[0] if items else None), str(listed.metadata.resource_version)

    async def _stream(self, version: str) -> AsyncIterator[tuple[str, Any, str]]:
        """(event type, Lease or None, resourceVersion to resume from) per watch event."""
        from kubernetes.aio import client

        coordination = await self._coordination()
        timeout = self.watch_timeout
        response = await self.api.call(
            "watch lease",
            lambda: coordination.list_namespaced_lease_without_preload_content(
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                resource_version=version,
                allow_watch_bookmarks=True,
                watch=True,
                timeout_seconds=int(timeout),
                _request_timeout=timeout + self.api.request_timeout,
            ),
        )
        try:
            if response.status == 410:
                raise _Relist(f"HTTP 410 for resourceVersion {version}")
            if response.status != 200:
                body = await response.text()
                if response.status == 403:
                    self.api.log_forbidden("watch lease", body.strip()[:300])
                raise _WatchBroken(f"watch answered HTTP {response.status}: {body.strip()[:300]}")
            while True:
                try:
                    async with asyncio.timeout(timeout + self.api.request_timeout):
                        line = await response.content.readline()
                except TimeoutError:
                    raise _WatchBroken("the watch stream went silent") from None
                except Exception as exc:  # aiohttp payload/connection errors
                    raise _WatchBroken(f"{type(exc).__name__}: {exc}") from exc
                if not line:
                    return  # the server ended the watch (timeoutSeconds): resume from version
                event = json.loads(line)
                kind = event.get("type")
                raw = event.get("object") or {}
                if kind == "ERROR":
                    if raw.get("code") == 410:
                        raise _Relist(str(raw.get("message")))
                    raise _WatchBroken(f"watch ERROR event: {raw.get('message')}")
                resume_at = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                version = resume_at
                if kind == "BOOKMARK":
                    yield kind, None, resume_at
                    continue
                yield kind, client.V1Lease.from_dict(raw), resume_at
        finally:
            response.release()

    async def close(self) -> None:
        await self.api.close()


class _Relist(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class _WatchBroken(Exception):
    """The watch failed in a way worth a reconnect with backoff."""
