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

A release may name a successor: the annotation ``leader-sidecar.io/successor`` on the released
Lease (an annotation, because older clients' models dropped spec fields they did not know, and
``spec.preferredHolder`` belongs to Coordinated Leader Election: dropped by API servers without
that feature gate, and read by its controller where it is on). A grant clears it.
A hand-over (a release that grants the successor in the same write) writes the successor as
holder, the next term, and the annotation ``leader-sidecar.io/handed`` (the successor's
candidate version it was chosen by); the successor's first renewal clears it.

A store that knows its group (`KubernetesStoreClient.lease`) labels the Lease it writes
``leader-sidecar/group=<group>``, so one namespace watch by that label can serve many Leases
(`sidecar.backends.kubernetes.fanout`); a Lease written by hand or by an older sidecar gets
the label with the first write of a newer one.

A deleted Lease is "no record": to the followers a store that lost state (waited out a full
lease, then re-created above every term seen), to its holder a grant to put back — its next
renewal creates the Lease again with its own name and term. A follower that saw it deleted
re-creates it as a loss marker (``holderIdentity: leader-sidecar.io/lost``, the term it saw),
so a replica that starts later waits the loss out too.

Expiry is observed by the elector (docs/design.md rule 2, `sidecar.observed`), as client-go does it:
the Lease counts as expired only after *this process* has seen the same resourceVersion
unchanged for ``leaseDurationSeconds`` on its own monotonic clock; the acquire that follows
is a PUT conditional on that very resourceVersion. ``renewTime`` is never trusted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from sidecar.backends import records
from sidecar.backends.base import (
    LOST_HOLDER,
    Conflict,
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreUnavailable,
    lost_grant,
    room_for_marker,
)
from sidecar.backends.kubernetes.client import (
    MERGE_PATCH,
    CallError,
    KubeApi,
    MicroTime,
    lease_path,
)
from sidecar.backends.kubernetes.reflector import CLIENT_GO, Listed, Pacing, Reflector
from sidecar.backends.kubernetes.watch import Selection, unavailable
from sidecar.backends.records import check_term
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.kubernetes.fanout import SharedLeaseWatch

logger = logging.getLogger("sidecar.kubernetes")

Lease = dict[str, Any]
"""A Lease as the API server sends it: plain JSON (``metadata``, ``spec``)."""

SUCCESSOR_ANNOTATION = "leader-sidecar.io/successor"
HANDED_ANNOTATION = "leader-sidecar.io/handed"
GROUP_LABEL = "leader-sidecar/group"


def whole_seconds(duration: float) -> int:
    """``leaseDurationSeconds`` is an int32: round up, so others never wait less than we hold."""
    return max(1, math.ceil(duration - 1e-9))


MAX_LEASE_TRANSITIONS = 2**31 - 1
"""``spec.leaseTransitions`` is an int32: the highest term a Lease holds. A grant past it is
refused before it is sent (`records.check_term`), and a Lease showing more cannot be read."""


def _metadata(lease: Lease) -> dict[str, Any]:
    metadata = lease.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _spec_of(lease: Lease) -> dict[str, Any]:
    spec = lease.get("spec")
    return spec if isinstance(spec, dict) else {}


def _stored_term(lease: Lease) -> int:
    """The Lease's term if a grant could have written it, else 0: what a grant counts from."""
    term = _spec_of(lease).get("leaseTransitions")
    return term if type(term) is int and 0 <= term <= MAX_LEASE_TRANSITIONS else 0


def _version(lease: Lease) -> str:
    """What the elector compares (rule 2): the Lease's uid with its resourceVersion. A
    resourceVersion alone can repeat after the API server's storage is restored or wiped (the
    revisions start again) and then name another object; the uid is new for every object."""
    metadata = _metadata(lease)
    return f"{metadata.get('uid') or ''}/{metadata.get('resourceVersion')}"


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
        labels: dict[str, str] | None = None,
        shared_watch: SharedLeaseWatch | None = None,
        owns_api: bool = True,
        pacing: Pacing = CLIENT_GO,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.api = api
        # Put on the Lease with every write (the group label the shared watch selects by).
        self.labels = dict(labels or {})
        # Watch through a namespace watch shared with other leases, instead of our own stream.
        self._shared_watch = shared_watch
        # A store made by a `KubernetesStoreClient` shares its client's API: closing it must
        # not close the connections of every other lease.
        self._owns_api = owns_api
        self.default_duration = default_duration
        self.watch_timeout = watch_timeout
        self._clock = clock
        self._rng = rng or random.Random()
        self._pacing = pacing  # how our own watch waits after failures (the reflector's)
        # What this process last saw of the Lease: the body a conditional write starts from.
        self._lease: Lease | None = None
        self.uid: str | None = None
        # The last holder seen in any observation, and who held the lease before our latest
        # grant: the demotion actions relabel that pod, even when it released the lease first.
        self.last_holder: str | None = None
        self.previous_holder: str | None = None

    @property
    def description(self) -> str:
        return f"kubernetes lease={self.namespace}/{self.name} ({self.api.server})"

    # -- observing --------------------------------------------------------------------------

    def _observe(self, lease: Lease | None) -> LeaseRecord | None:
        """Remember ``lease`` (None: it does not exist) and turn it into a record."""
        if lease is None:
            self._lease = None
            return None
        version = str(_metadata(lease).get("resourceVersion"))
        if self._lease is not None and not _newer(
            version, str(_metadata(self._lease).get("resourceVersion"))
        ):
            # A late watch event: keep the fresher state for our writes, but report what came
            # (after an API server's storage is wiped, resourceVersions start again, and a
            # "late" number is the store as it is now: a loss the elector must see).
            return self._record(lease)
        self._lease = lease
        self.uid = _metadata(lease).get("uid") or self.uid
        record = self._record(lease)
        self.last_holder = record.holder or self.last_holder
        return record

    def _record(self, lease: Lease) -> LeaseRecord:
        """The Lease as the contract's record, checked (`sidecar.backends.records`): a Lease
        written by hand or by another program may hold anything the API server lets through
        (an int32 term past ours, a negative lease, text with control characters)."""
        spec = _spec_of(lease)
        stored = spec.get("holderIdentity") or None
        holder = None if stored == LOST_HOLDER else stored  # a loss marker: not released
        annotations = _metadata(lease).get("annotations") or {}
        seconds = spec.get("leaseDurationSeconds")
        # Absent (or Go's zero value): a Lease nobody timed yet; ours always say.
        duration = self.default_duration if seconds in (None, 0) else seconds
        transitions = spec.get("leaseTransitions")
        return records.lease_record(
            holder=holder,
            term=0 if transitions is None else transitions,
            duration=duration,
            version=_version(lease),
            released=stored is None,  # an empty holderIdentity: released (or never held)
            successor=(annotations.get(SUCCESSOR_ANNOTATION) or None) if stored is None else None,
            handed=(annotations.get(HANDED_ANNOTATION) or None) if holder is not None else None,
            acquired_at=spec.get("acquireTime"),
            renewed_at=spec.get("renewTime"),
            max_term=MAX_LEASE_TRANSITIONS,
        )

    def _unavailable(self, error: CallError) -> StoreUnavailable:
        return unavailable(error, self.namespace)

    # -- requests ---------------------------------------------------------------------------

    @property
    def _path(self) -> str:
        return lease_path(self.namespace, self.name)

    async def _get(self) -> Lease | None:
        """The Lease, or None if it does not exist. Raises StoreUnavailable."""
        try:
            lease: Lease = await self.api.request("get lease", "GET", self._path)
        except CallError as error:
            if error.status == 404:
                return None
            raise self._unavailable(error) from None
        return lease

    async def _reread(self) -> LeaseRecord | None:
        """After a lost compare-and-swap: what is there now (None if it cannot be read)."""
        try:
            return self._observe(await self._get())
        except StoreUnavailable:
            return None

    def _spec(self, identity: str, duration: float, term: int, acquired: bool) -> dict[str, Any]:
        now = MicroTime.at(self._clock.wall()).isoformat()
        spec: dict[str, Any] = {
            "holderIdentity": identity,
            "leaseDurationSeconds": whole_seconds(duration),
            "renewTime": now,
            "leaseTransitions": term,
        }
        if acquired:
            spec["acquireTime"] = now
        return spec

    def _bounded(self, term: int) -> int:
        return check_term(term, MAX_LEASE_TRANSITIONS, self.description)

    async def _create(self, identity: str, duration: float, term: int) -> LeaseRecord:
        """POST the Lease with ``term``. A 409 AlreadyExists is a `Conflict`."""
        self._bounded(term)
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": self._spec(identity, duration, max(1, term), acquired=True),
        }
        try:
            created: Lease = await self.api.request(
                "create lease", "POST", lease_path(self.namespace), body=body
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

    async def _patch(
        self,
        op: str,
        lease: Lease,
        spec: dict[str, Any],
        annotations: dict[str, Any] | None = None,
    ) -> Lease:
        """A merge patch conditional on ``lease``'s resourceVersion, adding our labels and
        ``annotations`` (None deletes a key). Raises CallError for 404 and 409,
        StoreUnavailable for everything else."""
        # The uid too: after an etcd restore or wipe, resourceVersions start again, and a
        # number seen before could name another Lease; the uid never repeats (and the API
        # server refuses a write whose uid does not match the object's).
        metadata: dict[str, Any] = {"resourceVersion": _metadata(lease).get("resourceVersion")}
        if _metadata(lease).get("uid"):
            metadata["uid"] = _metadata(lease)["uid"]
        if self.labels:
            metadata["labels"] = self.labels
        if annotations:
            metadata["annotations"] = annotations
        patch = {"metadata": metadata, "spec": spec}
        try:
            written: Lease = await self.api.request(
                op, "PATCH", self._path, body=patch, content_type=MERGE_PATCH
            )
            return written
        except CallError as error:
            # 422 on our uid: the name now holds another Lease (see `_version`); decided like a
            # 409, by reading what is there.
            if error.status in (404, 409) or (error.status == 422 and "uid" in error.message):
                raise
            raise self._unavailable(error) from None

    # -- the contract -----------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return self._observe(await self._get())

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        previous = self.last_holder
        # 1. Nothing expected: create the Lease (409 AlreadyExists: someone has one).
        if expected is None:
            self.previous_holder = previous
            return await self._create(identity, duration, min_term + 1)
        # 2. The body to write over: the one we observed, if it is the expected version.
        lease = self._lease
        if lease is None or _version(lease) != expected:
            lease = await self._get()
            record = self._observe(lease)
            if lease is None or _version(lease) != expected:
                raise LeaseHeld(f"the lease is not at resourceVersion {expected}", record)
        record = self._record(lease)
        self.previous_holder = record.holder or previous
        # 3. Take it with the next term, conditional on that resourceVersion (rule 1).
        term = self._bounded(max(_stored_term(lease), min_term) + 1)
        try:
            written = await self._replace(lease, identity, duration, term, acquired=True)
        except CallError as error:
            if error.status in (404, 409):
                # Someone wrote (or deleted it) since: never retry blindly, report what is there.
                raise Conflict(
                    f"lost the race for the lease: {error}", await self._reread()
                ) from None
            raise self._unavailable(error) from None
        granted = self._observe(written)
        assert granted is not None
        return granted

    async def _replace(
        self, lease: Lease, identity: str, duration: float, term: int, *, acquired: bool
    ) -> Lease:
        """PUT the Lease conditional on ``lease``'s resourceVersion (and uid: both are in the
        metadata written back). Raises CallError."""
        spec = self._spec(identity, duration, term, acquired=acquired)
        if not acquired and _spec_of(lease).get("acquireTime"):
            spec["acquireTime"] = _spec_of(lease)["acquireTime"]  # as the server wrote it
        # Our labels on, the successor off: a grant (or a grant put back) ends a hand-over.
        metadata = dict(_metadata(lease))
        labels = {**(metadata.get("labels") or {}), **self.labels}
        annotations = dict(metadata.get("annotations") or {})
        annotations.pop(SUCCESSOR_ANNOTATION, None)
        annotations.pop(HANDED_ANNOTATION, None)
        for key, value in (("labels", labels), ("annotations", annotations)):
            if value:
                metadata[key] = value
            else:
                metadata.pop(key, None)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
        op = "acquire lease" if acquired else "restore lease"
        written: Lease = await self.api.request(op, "PUT", self._path, body=body)
        return written

    async def _owned(self, identity: str, term: int) -> Lease:
        """Our latest view of the Lease if it is ``identity``'s grant of ``term``; else
        NotOwned without writing anything."""
        lease = self._lease if self._lease is not None else await self._get()
        if lease is None:
            self._observe(None)
            raise NotOwned(f"lease {self.namespace}/{self.name} does not exist", None)
        record = self._record(lease)
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
        lease = self._lease if self._lease is not None else await self._get()
        if lease is None:
            return await self._restore(None, identity, term, duration)
        record = self._record(lease)
        if record.holder != identity or record.term != term:
            if lost_grant(record, term):
                return await self._restore(lease, identity, term, duration)
            raise NotOwned(
                f"held by {record.holder} with term {record.term}, not {identity} with {term}",
                record,
            )
        # The first renewal after a hand-over ends it.
        ended = {HANDED_ANNOTATION: None} if record.handed is not None else None
        try:
            written = await self._patch(
                "renew lease", lease, self._spec(identity, duration, term, acquired=False), ended
            )
        except CallError as error:
            if error.status == 404:  # deleted since we last saw it
                return await self._restore(None, identity, term, duration)
            failure = await self._after_failed_write(error, identity, term)
            if isinstance(failure, NotOwned) and lost_grant(failure.record, term):
                # Re-created as a follower's loss marker of our term since we last saw it.
                return await self._restore(self._lease, identity, term, duration)
            raise failure from None
        renewed = self._observe(written)
        assert renewed is not None
        return renewed

    async def _restore(
        self, lease: Lease | None, identity: str, term: int, duration: float
    ) -> LeaseRecord:
        """The Lease is gone (``lease`` None) or holds an older term: the store lost our
        grant. Put it back — create it, or overwrite the older one conditionally — so the
        others see our name and term again (rule 5)."""
        log(
            logger,
            "warning",
            "the Lease lost our grant (deleted or rewound); putting it back",
            lease=f"{self.namespace}/{self.name}",
            term=term,
            found_term=self._record(lease).term if lease is not None else None,
        )
        if lease is None:
            try:
                return await self._create(identity, duration, term)
            except Conflict as raced:
                fresh = raced.record
                if fresh is not None and fresh.holder == identity and fresh.term == term:
                    raise
                if fresh is not None and lost_grant(fresh, term) and self._lease is not None:
                    # A follower's loss marker was created first: put the grant back over it.
                    return await self._restore(self._lease, identity, term, duration)
                raise NotOwned(f"the lease changed hands: {raced}", fresh) from None
        try:
            written = await self._replace(lease, identity, duration, term, acquired=False)
        except CallError as error:
            raise await self._after_failed_write(error, identity, term) from None
        record = self._observe(written)
        assert record is not None
        return record

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        """Create the marker (POST), or raise a lower one (PUT on its resourceVersion); a
        409 or 404 means someone wrote first: report what is there."""
        lease = await self._get()
        record = self._observe(lease)
        if not room_for_marker(record, term):
            return record
        try:
            if lease is None:
                return await self._create(LOST_HOLDER, duration, term)
            written = await self._replace(lease, LOST_HOLDER, duration, term, acquired=False)
        except Conflict as raced:
            return raced.record
        except CallError as error:
            if error.status in (404, 409):
                return await self._reread()
            raise self._unavailable(error) from None
        return self._observe(written)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        lease = await self._owned(identity, term)
        try:
            written = await self._patch(
                "release lease",
                lease,
                # An empty holder keeps the term (leaseTransitions) and wakes every watcher.
                {"holderIdentity": "", "renewTime": MicroTime.at(self._clock.wall()).isoformat()},
                # The successor in the same write; None deletes one a hand-edit left behind,
                # and a hand-over's mark (a successor giving back what was handed to it).
                {SUCCESSOR_ANNOTATION: successor or None, HANDED_ANNOTATION: None},
            )
        except CallError as error:
            raise await self._after_failed_write(error, identity, term) from None
        return self._observe(written)

    @property
    def hands_over(self) -> bool:
        return True

    async def hand_over(
        self,
        identity: str,
        term: int,
        *,
        successor: str,
        handed: str,
        duration: float,
        min_term: int,
    ) -> LeaseRecord:
        new_term = self._bounded(max(term, min_term) + 1)
        lease = await self._owned(identity, term)
        try:
            written = await self._patch(
                "hand over lease",
                lease,
                self._spec(successor, duration, new_term, acquired=True),
                {SUCCESSOR_ANNOTATION: None, HANDED_ANNOTATION: handed},
            )
        except CallError as error:
            raise await self._after_failed_write(error, identity, term) from None
        record = self._observe(written)
        assert record is not None
        return record

    # -- the watch --------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Through the shared namespace watch if this store has one, else a watch of its own.
        Either way: the state once after every (re)connection, then every change. Never raises
        StoreError; runs until cancelled."""
        if self._shared_watch is not None:
            async for lease in self._shared_watch.subscribe(self.name):
                yield self._observe(lease)
            return
        async for record in self._watch_one():
            yield record

    async def _watch_one(self) -> AsyncIterator[LeaseRecord | None]:
        """List the one Lease, then watch it from that resourceVersion (`Reflector`). After a
        broken stream the reflector lists again: the elector must see what is there now (a
        store that lost the Lease, rule 8), not resume silently."""
        reflector = Reflector(
            self.api,
            Selection(self.namespace, field_selector=f"metadata.name={self.name}"),
            "lease",
            watch_timeout=self.watch_timeout,
            pacing=self._pacing,
            rng=self._rng,
        )
        async with contextlib.aclosing(reflector.events()) as events:
            async for event in events:
                if isinstance(event, Listed):
                    yield self._observe(event.items[0] if event.items else None)
                elif event.kind == "DELETED":
                    yield self._observe(None)
                else:
                    yield self._observe(event.obj)

    async def close(self) -> None:
        if self._owns_api:
            await self.api.close()
