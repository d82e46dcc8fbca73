"""The candidates of one group in etcd: one key per replica, ``PREFIX/candidates/GROUP/ID``,
whose value is JSON ``{"identity", "version", "revision", "priority", "leaving",
"started_at", "beat_at"}`` (readable with ``etcdctl get --prefix``).

Each replica writes only its own key, with a plain put (nobody else writes it, so no
condition is needed) and a new version on every beat; readers judge liveness from versions
on their own clock (rule 2). ``beat_at`` is wall time, for humans and for the garbage
collection here: once a minute a beating replica removes the records not beaten for 20 leases
(at least a minute) by its clock, each removal conditional on the record's ``mod_revision``,
so a replica that beat in between keeps its record. No etcd lease is involved: a TTL would
be kept by etcd's leader clock, and records here are garbage collection only either way.

`changes` follows the group's prefix on the client's watch streams and yields every record at
each change (every beat is one), like Kubernetes' candidates Lease.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sidecar.backends import records
from sidecar.backends.base import Candidate, StoreError
from sidecar.backends.etcd.api import b64
from sidecar.backends.etcd.records import (
    KeyValue,
    candidates_prefix,
    range_end,
    range_op,
)
from sidecar.backends.kit import candidate_json
from sidecar.backends.kit.candidate_json import candidate_object
from sidecar.backends.kit.lease_json import encode
from sidecar.backends.kit.versions import new_version
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.etcd.connection import EtcdConnection

logger = logging.getLogger("sidecar.etcd")

GC_LEASES = 20
GC_MIN = 60.0  # seconds
GC_EVERY = 60.0  # monotonic seconds between two garbage collections of one registry


def decode(kv: KeyValue, prefix: bytes) -> Candidate:
    """The candidate a key holds, checked (`sidecar.backends.records`): a value that is not
    ours, or one under another identity's key, is left out by the reader (and left alone)."""
    candidate = candidate_json.decode(kv.key, kv.value)
    if candidate.unreadable is None and kv.key != prefix + candidate.identity.encode():
        problem = f"identity {candidate.identity!r} written under another identity's key"
        return records.unreadable_candidate(kv.key, candidate.version, problem)
    return candidate


class EtcdCandidates:
    def __init__(self, client: EtcdConnection, group: str) -> None:
        self.client = client
        self.group = group
        self.prefix = candidates_prefix(client.target.prefix, group)
        self.end = range_end(self.prefix)
        self._last_gc = float("-inf")
        self._following = 0

    def _key(self, identity: str) -> bytes:
        return self.prefix + identity.encode()

    async def beat(self, candidate: Candidate, duration: float) -> None:
        wall = self.client.clock.wall()
        value = encode(candidate_object(candidate, candidate.version or new_version(), wall))
        put = {"key": b64(self._key(candidate.identity)), "value": b64(value)}
        await self.client.call("beat", "/v3/kv/put", put)
        now = self.client.clock.now()
        if now - self._last_gc >= GC_EVERY:
            self._last_gc = now
            await self._collect(wall - timedelta(seconds=max(GC_MIN, GC_LEASES * duration)))

    async def list(self) -> builtins.list[Candidate]:
        kvs = await self._kvs()
        return [decode(kv, self.prefix) for kv in kvs]

    async def _kvs(self) -> builtins.list[KeyValue]:
        answer = await self.client.call("list candidates", "/v3/kv/range", self._range())
        return [KeyValue.decode(kv) for kv in answer.get("kvs") or []]

    def _range(self) -> dict[str, Any]:
        return range_op(self.prefix, self.end)

    async def leave(self, identity: str) -> None:
        await self.client.call("leave", "/v3/kv/deleterange", range_op(self._key(identity)))

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """Every record of the group at each change, after every (re)connection first."""
        subscription = self.client.hub.join(self.prefix, self.end, within=(self.prefix, self.end))
        self._following += 1
        try:
            while True:
                state, _as_of = await subscription.next()
                yield [decode(kv, self.prefix) for kv in state.values()]
        finally:
            self._following -= 1
            self.client.hub.leave(subscription)

    def following(self) -> bool:
        return self._following > 0 and self.client.hub.watching(self.prefix)

    async def _collect(self, older_than: datetime) -> None:
        """Remove records beaten before ``older_than`` (wall clock: garbage collection only),
        each only if nobody wrote it since it was read. Best effort."""
        try:
            for kv in await self._kvs():
                candidate = decode(kv, self.prefix)
                beat_at = candidate.beat_at
                if beat_at is None or beat_at.tzinfo is None or beat_at >= older_than:
                    continue
                written, _ = await self.client.swap("collect candidate", kv.key, kv, None)
                if written:
                    log(logger, "info", "removed a stale candidate", identity=candidate.identity)
        except StoreError:
            return
