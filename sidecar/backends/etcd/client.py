"""`EtcdStoreClient`: the leases and candidate groups of one etcd cluster, and their renewals
in nested ``Txn``s, on the gateway, watch streams and epoch of a `connection.EtcdConnection`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from sidecar.backends.base import Conflict, NotOwned, Renewal, RenewalOutcome, StoreError
from sidecar.backends.etcd.candidates import EtcdCandidates
from sidecar.backends.etcd.connection import EtcdConnection, revision_of
from sidecar.backends.etcd.records import (
    MAX_TXN_OPS,
    KeyValue,
    chunks,
    lease_key,
    put_op,
    range_op,
    same_as,
)
from sidecar.backends.etcd.store import EtcdLease
from sidecar.backends.etcd.target import EtcdTarget
from sidecar.backends.kit.lease_json import renewal_value

RENEW_ROUNDS = 3


class EtcdStoreClient(EtcdConnection):
    """The `StoreClient` of one etcd cluster."""

    def lease(self, name: str) -> EtcdLease:
        return EtcdLease(self, name)

    def candidates(self, group: str) -> EtcdCandidates:
        return EtcdCandidates(self, group)

    # -- many renewals in one round trip (`RenewsMany`) ----------------------------------------

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """`RenewsMany`: one ``Txn`` whose ``Then`` holds a nested ``Txn`` per lease (each as
        conditional as a lease's own renewal: a flat ``Txn``'s compares would be
        all-or-nothing), at most `MAX_TXN_OPS` leases per ``Txn`` (etcd refuses more than
        ``--max-txn-ops``); larger batches go as several ``Txn``s at once. A lease whose
        compare lost a race answers `Conflict`: its elector renews it again at once."""
        if not renewals:
            return []
        keys = [lease_key(self.target.prefix, r.name) for r in renewals]
        unseen = [key for key in keys if key not in self.seen]
        for chunk in chunks(unseen, MAX_TXN_OPS):
            found, revision = await self.read_ranges([(key, None) for key in chunk])
            for key, kvs in zip(chunk, found, strict=True):
                self.note(key, kvs[0] if kvs else None, revision)
        outcomes: list[RenewalOutcome | None] = [None] * len(renewals)
        pending = list(range(len(renewals)))
        # A lease whose compare lost (its record changed since this client saw it: a watch
        # event not in yet, a store that lost it) goes again on what the failed Txn read, as
        # a lease's own renewal does; at most `RENEW_ROUNDS` requests in a row.
        for _round in range(RENEW_ROUNDS):
            planned = self._plan_renewals(renewals, keys, pending, outcomes)
            if not planned:
                break
            pending = await self._send_renewals(planned, outcomes)
        for index in pending:
            if outcomes[index] is None:
                outcomes[index] = Conflict("the lease kept changing under the renewal", None)
        return [outcome for outcome in outcomes if outcome is not None]

    def _plan_renewals(
        self,
        renewals: Sequence[Renewal],
        keys: list[bytes],
        pending: list[int],
        outcomes: list[RenewalOutcome | None],
    ) -> list[_Planned]:
        """What each pending renewal writes over what this client saw of its key; a lease
        that is not the caller's is answered at once (NotOwned, as `renew` would)."""
        planned: list[_Planned] = []
        wall = self.clock.wall()
        for index in pending:
            renewal, key = renewals[index], keys[index]
            seen = self.seen.get(key)
            record = None if seen is None else self.record(seen)
            value = renewal_value(record, renewal.identity, renewal.term, renewal.duration, wall)
            if value is None:
                outcomes[index] = NotOwned(
                    f"not held by {renewal.identity} with term {renewal.term}", record
                )
                continue
            planned.append(_Planned(index, key, seen, value))
        return planned

    async def _send_renewals(
        self,
        planned: list[_Planned],
        outcomes: list[RenewalOutcome | None],
    ) -> list[int]:
        """The planned renewals, `MAX_TXN_OPS` per ``Txn``, the ``Txn``s at once. Fills in
        ``outcomes``; returns the leases to try again. Raises `StoreUnavailable` when no
        ``Txn`` answered (nothing is known about any lease)."""
        batches = list(chunks(planned, MAX_TXN_OPS))
        answers = await asyncio.gather(
            *(self._renew_chunk(chunk) for chunk in batches), return_exceptions=True
        )
        failures = [a for a in answers if isinstance(a, BaseException)]
        if len(failures) == len(answers):
            raise failures[0]
        again: list[int] = []
        for chunk, answer in zip(batches, answers, strict=True):
            if isinstance(answer, StoreError):
                for entry in chunk:
                    outcomes[entry.index] = answer
                continue
            if isinstance(answer, BaseException):
                raise answer
            for entry, (written, now) in zip(chunk, answer, strict=True):
                record = None if now is None else self.record(now)
                if written:
                    assert record is not None
                    outcomes[entry.index] = record
                else:
                    again.append(entry.index)  # planned again on what the Txn read
        return again

    async def _renew_chunk(self, chunk: list[_Planned]) -> list[tuple[bool, KeyValue | None]]:
        """One ``Txn`` of nested ``Txn``s: per lease (written, what the key holds now)."""
        nested = [
            {
                "request_txn": {
                    "compare": same_as(entry.key, entry.seen),
                    "success": [put_op(entry.key, entry.value)],
                    "failure": [{"request_range": range_op(entry.key)}],
                }
            }
            for entry in chunk
        ]
        self.writes += 1
        answer = await self.call("renew many", "/v3/kv/txn", {"success": nested})
        revision = revision_of(answer)
        responses = answer.get("responses") or []
        if len(responses) != len(chunk):
            raise self.fail("error", f"a batch of {len(chunk)} answered {len(responses)}")
        results: list[tuple[bool, KeyValue | None]] = []
        for entry, response in zip(chunk, responses, strict=True):
            key, value = entry.key, entry.value
            txn = response.get("response_txn") or {}
            if txn.get("succeeded"):
                now: KeyValue | None = KeyValue(key, value, revision)
                self.seen[key] = now
                results.append((True, now))
                continue
            inner = (txn.get("responses") or [{}])[0]
            kvs = (inner.get("response_range") or {}).get("kvs") or []
            now = KeyValue.decode(kvs[0]) if kvs else None
            self.note(key, now, revision)
            results.append((False, now))
        return results


@dataclasses.dataclass(frozen=True, slots=True)
class _Planned:
    """One lease of a batch: the write, and the key's state it is conditional on."""

    index: int
    key: bytes
    seen: KeyValue | None
    value: bytes


class EtcdLeaseStore(EtcdLease):
    """One lease with a client of its own (``--store etcd://…`` with one ``--lease``)."""

    def __init__(self, target: EtcdTarget, lease: str, *, request_timeout: float = 2.0) -> None:
        super().__init__(EtcdStoreClient(target, request_timeout=request_timeout), lease)

    async def close(self) -> None:
        await self.client.close()
