"""One etcd connection for every lease of a sidecar: the gateway, the watch streams, the epoch,
what was last seen of each key, and how failures are reported. `EtcdLease` objects (from
`store`) and `EtcdCandidates` (from `candidates`) hold only their keys and borrow all of this;
the `client.EtcdStoreClient` built on it makes them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sidecar.backends.base import (
    LeaseRecord,
    StoreUnavailable,
)
from sidecar.backends.etcd.api import EtcdApi, EtcdError, unavailable
from sidecar.backends.etcd.records import (
    KeyValue,
    lease_key,
    put_op,
    range_end,
    range_op,
    same_as,
)
from sidecar.backends.etcd.target import EtcdTarget
from sidecar.backends.etcd.watch import WatchHub
from sidecar.backends.kit import versions
from sidecar.backends.kit.guard import Guard
from sidecar.backends.kit.lease_json import decode_record
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log
from sidecar.supervisor import Supervisor

T = TypeVar("T")
logger = logging.getLogger("sidecar.etcd")


class EtcdConnection:
    """Every lease and candidate group of one sidecar in one etcd cluster: one HTTP session to
    the current endpoint, at most `MAX_IN_FLIGHT` requests at a time, the watch streams of
    every lease (`WatchHub`), one epoch."""

    MAX_IN_FLIGHT = 16

    def __init__(
        self,
        target: EtcdTarget,
        *,
        request_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        silence: float = 30.0,
        probe_every: float = 5.0,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.target = target
        # Restarts a watch stream's task if it fails (a bug: the loop itself never raises).
        self.supervisor = supervisor or Supervisor()
        self.request_timeout = request_timeout
        self.clock = clock
        self.api = EtcdApi(target, request_timeout=request_timeout, on_restore=self.restored)
        self._slots = asyncio.Semaphore(self.MAX_IN_FLIGHT)
        # Bumped whenever this client may have missed a write, or the cluster went back in
        # time: a watch stream broke (etcd may have been restored meanwhile, behind it), or an
        # answer showed a revision below one seen before (a restore from an older snapshot).
        # It is part of every version reported, for every lease, so an observer restarts its
        # count from what etcd shows *now*: after a restore, an older value can come back
        # byte for byte, under the revision it had, without the renewals that followed it
        # (rule 2). One cluster, one epoch.
        self.epoch = 0
        # The revision etcd answered at when this client saw it go back (0: never): every
        # key last written at or before it is shown as a loss (see `record`).
        self.restored_revision = 0
        # What was last seen of each key (None: absent): a write is conditional on exactly it.
        self.seen: dict[bytes, KeyValue | None] = {}
        self.guard = Guard("etcd", logger, lambda: self.description)
        self.writes = 0  # Txns that write, sent (tests count requests, as client-go's do)
        self.hub = WatchHub(self, silence=silence, probe_every=probe_every)
        # Every lease's key is under this range: the leases share one watch stream of it.
        leases = lease_key(target.prefix, "")
        self.leases_range = (leases, range_end(leases))

    @property
    def description(self) -> str:
        return self.target.describe()

    # -- versions ---------------------------------------------------------------------------

    def record(self, kv: KeyValue) -> LeaseRecord:
        """The record ``kv`` holds (checked: one that is not ours is unreadable), with this
        client's epoch in its version."""
        record = decode_record(kv.value)
        version = f"{record.version}{versions.epoch_tag(self.epoch)}"
        if kv.mod_revision <= self.restored_revision and record.unreadable is None:
            # Written before etcd went back in time (a restore from an older snapshot): what
            # it shows is what the store remembered, not what it last granted. Shown as the
            # store's loss, at the term it holds (a loss marker: no holder, not released), so
            # every replica that saw etcd go back waits a lease and jumps its next grant above
            # every term seen (rules 5, 8), also one that never saw a grant the restore
            # forgot; the holder puts its grant back over it. Writes still compare the real
            # value. The next write of the key ends it. (One that cannot be read is a loss
            # already.)
            return LeaseRecord(
                holder=None, term=record.term, duration=record.duration, version=version
            )
        return dataclasses.replace(record, version=version)

    def untagged(self, version: str) -> str | None:
        """The stored version a reported one names, or None if it was reported in an earlier
        epoch (seen before etcd may have gone back: no basis for a grant)."""
        return versions.untagged(version, self.epoch)

    def note(self, key: bytes, kv: KeyValue | None, as_of: int) -> None:
        """Remember what ``key`` holds as of revision ``as_of``, unless something later is
        remembered already (answers to requests in flight together, and watch lists, can
        come in after a newer answer)."""
        known = self.seen.get(key)
        if known is None or as_of >= known.mod_revision:
            self.seen[key] = kv

    def newest(self, key: bytes, kv: KeyValue | None, as_of: int) -> KeyValue | None:
        """What ``key`` holds: ``kv``, as a watch shows it current at revision ``as_of``, or
        what this client saw later (its own write, a read), whichever is newer. A watch lists
        again while this client writes: its list can come in after a grant the client made
        and saw, and must not show that grant undone (a loss to the elector)."""
        known = self.seen.get(key)
        if known is not None and known.mod_revision > as_of:
            return known
        self.note(key, kv, as_of)
        return kv

    def lost_sight(self, why: str) -> None:
        """A new epoch: writes this client saw may be gone (see ``epoch``)."""
        self.epoch += 1
        log(logger, "info", "etcd: every lease is timed anew", why=why, epoch=self.epoch)

    def restored(self, why: str) -> None:
        log(logger, "warning", "etcd went back in time", why=why)
        self.restored_revision = self.api.revision
        self.seen.clear()
        self.lost_sight(why)

    # -- requests ---------------------------------------------------------------------------

    async def call(self, op: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request, after one of the client's request slots. Raises `StoreUnavailable`
        with the cause (logged once per distinct problem)."""
        try:
            async with asyncio.timeout(self.request_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise self.fail(
                "warning", f"every request slot stayed busy for {self.request_timeout:g}s"
            ) from None
        try:
            answer = await self.api.call(op, path, body)
        except EtcdError as error:
            failure = unavailable(error, self.target)
            self.guard.report("warning", str(failure), str(failure))
            raise failure from None
        finally:
            self._slots.release()
        self.guard.answered()
        return answer

    async def guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one store operation; anything that is not an answer about the lease becomes
        `StoreUnavailable`."""
        # A malformed answer: the contract allows only StoreErrors.
        return await self.guard.run(
            work, lambda exc: self.fail("error", f"unexpected answer: {type(exc).__name__}: {exc}")
        )

    def fail(self, level: str, cause: str) -> StoreUnavailable:
        message = f"etcd {self.description}: {cause}"
        self.guard.report(level, message, message)
        return StoreUnavailable(message)

    async def read(self, key: bytes) -> KeyValue | None:
        """The key, linearizably. Raises `StoreUnavailable`."""
        answer = await self.call("range", "/v3/kv/range", range_op(key))
        kvs = answer.get("kvs") or []
        kv = KeyValue.decode(kvs[0]) if kvs else None
        self.note(key, kv, revision_of(answer))
        return kv

    async def read_ranges(
        self, ranges: list[tuple[bytes, bytes | None]]
    ) -> tuple[list[list[KeyValue]], int]:
        """Several keys or prefixes in one linearizable read-only ``Txn`` (at most
        `MAX_TXN_OPS`): what each holds and the revision they were read at."""
        body = {"success": [{"request_range": range_op(key, end)} for key, end in ranges]}
        answer = await self.call("read", "/v3/kv/txn", body)
        found: list[list[KeyValue]] = []
        for response in answer.get("responses") or []:
            kvs = (response.get("response_range") or {}).get("kvs") or []
            found.append([KeyValue.decode(kv) for kv in kvs])
        if len(found) != len(ranges):
            raise self.fail("error", f"a read of {len(ranges)} ranges answered {len(found)}")
        revision = revision_of(answer)
        return found, revision

    async def swap(
        self, op: str, key: bytes, seen: KeyValue | None, value: bytes | None
    ) -> tuple[bool, KeyValue | None]:
        """Write ``value`` (None: delete the key) if ``key`` still holds exactly ``seen``
        (None: nothing), in one ``Txn`` (rule 1). Returns (written, what the key holds now):
        the write, or what the ``Txn`` read instead of writing."""
        then = [
            put_op(key, value) if value is not None else {"request_delete_range": range_op(key)}
        ]
        body = {
            "compare": same_as(key, seen),
            "success": then,
            "failure": [{"request_range": range_op(key)}],
        }
        self.writes += 1
        answer = await self.call(op, "/v3/kv/txn", body)
        if answer.get("succeeded"):
            revision = revision_of(answer)
            now = None if value is None else KeyValue(key, value, revision)
            self.seen[key] = now
            return True, now
        responses = answer.get("responses") or [{}]
        kvs = (responses[0].get("response_range") or {}).get("kvs") or []
        kv = KeyValue.decode(kvs[0]) if kvs else None
        self.note(key, kv, revision_of(answer))
        return False, kv

    async def close(self) -> None:
        await self.hub.close()
        await self.api.close()


def revision_of(answer: dict[str, Any]) -> int:
    """The revision an answer is current at (its header's)."""
    return int((answer.get("header") or {}).get("revision") or 0)
