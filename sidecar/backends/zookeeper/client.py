"""`ZooKeeperStoreClient`: the leases and candidate groups of one ZooKeeper ensemble, and their
renewals in one ``multi``, on the session, watch and epoch of a
`connection.ZooKeeperConnection`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from sidecar.backends.base import NotOwned, Renewal, RenewalOutcome, StoreError, StoreUnavailable
from sidecar.backends.kit.lease_json import renewal_value
from sidecar.backends.zookeeper import jute
from sidecar.backends.zookeeper.candidates import ZooKeeperCandidates
from sidecar.backends.zookeeper.connection import ZooKeeperConnection
from sidecar.backends.zookeeper.jute import Node
from sidecar.backends.zookeeper.reads import FollowerReads
from sidecar.backends.zookeeper.store import ZooKeeperLease
from sidecar.backends.zookeeper.target import ZooKeeperTarget

# Multis a batch sends in a row before its leases that still fail go on their own.
RENEW_ROUNDS = 3
# The most a multi carries: half of the server's default ``jute.maxbuffer`` (1 MiB), which
# refuses a larger request by closing the connection.
MAX_MULTI_BYTES = 512 * 1024
# The most leases one read of the unseen ones asks for (`FollowerReads.MOST`).
READ_MOST = FollowerReads.MOST


class ZooKeeperStoreClient(ZooKeeperConnection):
    """The `StoreClient` of one ZooKeeper ensemble."""

    def lease(self, name: str) -> ZooKeeperLease:
        return ZooKeeperLease(self, name)

    def candidates(self, group: str) -> ZooKeeperCandidates:
        return ZooKeeperCandidates(self, group)

    # -- many renewals in one round trip (`RenewsMany`) ----------------------------------------

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """`RenewsMany`: one ``multi`` of a ``setData`` per lease, each on the data version
        this client saw last (the compare of a lease's own renewal). A ``multi`` is all or
        nothing, and tells which operation failed first: that lease renews on its own (its
        own ``renew``: it reads what is there and answers as alone) and the others go again
        in another ``multi``, at most `RENEW_ROUNDS` in a row; those still left renew on their
        own. A lease this client saw absent (a grant to put back: a ``create``) renews on its
        own too. Larger batches go as several ``multi`` at once (`MAX_MULTI_BYTES`)."""
        if not renewals:
            return []
        return await self.guarded(lambda: self._renew_many(renewals))

    async def _renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        leases = [self.lease(renewal.name) for renewal in renewals]
        # The leases not seen yet are read together (one whose read fails renews alone).
        unseen = list(dict.fromkeys(lease.key for lease in leases if lease.key not in self.seen))
        await asyncio.gather(
            *(self.read_many(unseen[i : i + READ_MOST]) for i in range(0, len(unseen), READ_MOST))
        )
        outcomes: list[RenewalOutcome | None] = [None] * len(renewals)
        alone: list[int] = []  # the leases that renew with a request of their own
        planned: list[_Planned] = []
        wall = self.clock.wall()
        for index, (renewal, lease) in enumerate(zip(renewals, leases, strict=True)):
            seen = self.seen.get(lease.key)
            record = None if seen is None else self.record(seen)
            value = renewal_value(record, renewal.identity, renewal.term, renewal.duration, wall)
            if value is None:
                outcomes[index] = NotOwned(
                    f"not held by {renewal.identity} with term {renewal.term}", record
                )
            elif seen is None:
                alone.append(index)
            else:
                planned.append(_Planned(index, lease.key, seen, value))
        if planned:
            chunks = _chunks(planned)
            answers = await asyncio.gather(
                *(self._renew_chunk(chunk, outcomes) for chunk in chunks), return_exceptions=True
            )
            for chunk, answer in zip(chunks, answers, strict=True):
                if isinstance(answer, StoreError):
                    for entry in chunk:
                        outcomes[entry.index] = answer
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    alone += answer
        await asyncio.gather(*(self._renew_alone(i, renewals[i], outcomes) for i in alone))
        answered = [outcome for outcome in outcomes if outcome is not None]
        assert len(answered) == len(renewals)
        unavailable = [o for o in answered if isinstance(o, StoreUnavailable)]
        if len(unavailable) == len(answered):
            raise unavailable[0]  # nothing is known of any lease
        return answered

    async def _renew_chunk(
        self, chunk: list[_Planned], outcomes: list[RenewalOutcome | None]
    ) -> list[int]:
        """The chunk's leases in one ``multi``, again without the one that failed, up to
        `RENEW_ROUNDS` times. Fills in ``outcomes``; returns the leases to renew on their
        own. Raises `StoreUnavailable` when the first ``multi`` was not answered; a later one
        not answered fails its leases."""
        alone: list[int] = []
        pending = chunk
        for round_ in range(RENEW_ROUNDS):
            if not pending:
                return alone
            epoch = self.epoch
            ops = [
                (jute.SET_DATA, jute.set_data(entry.path, entry.value, entry.seen.stat.version))
                for entry in pending
            ]
            try:
                results = await self.multi("renew many", ops)
            except StoreUnavailable as failed:
                if round_ == 0:
                    raise
                for entry in pending:
                    outcomes[entry.index] = failed
                return alone
            failed_at = next((i for i, result in enumerate(results) if result.err != jute.OK), None)
            if failed_at is None:
                for entry, result in zip(pending, results, strict=True):
                    assert result.stat is not None
                    node = Node(entry.value, result.stat)
                    self.saw(entry.path, node, epoch)
                    outcomes[entry.index] = self.record(node)
                return alone
            # Nothing was written. The lease that failed answers as alone; the others were
            # not refused (those before it) or not tried (after it): they go again.
            alone.append(pending[failed_at].index)
            pending = pending[:failed_at] + pending[failed_at + 1 :]
        return alone + [entry.index for entry in pending]

    async def _renew_alone(
        self, index: int, renewal: Renewal, outcomes: list[RenewalOutcome | None]
    ) -> None:
        try:
            outcomes[index] = await self.lease(renewal.name).renew(
                renewal.identity, renewal.term, renewal.duration
            )
        except StoreError as failed:
            outcomes[index] = failed


@dataclasses.dataclass(frozen=True, slots=True)
class _Planned:
    """One lease of a batch: the write, and the znode as seen, which it is conditional on."""

    index: int
    path: str
    seen: Node
    value: bytes

    @property
    def size(self) -> int:
        """About what its ``setData`` adds to a ``multi``: the path, the data, the headers."""
        return len(self.path) + len(self.value) + 32


def _chunks(planned: list[_Planned]) -> list[list[_Planned]]:
    """``planned`` in ``multi``s of at most `MAX_MULTI_BYTES`."""
    chunks: list[list[_Planned]] = [[]]
    size = 0
    for entry in planned:
        if chunks[-1] and size + entry.size > MAX_MULTI_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry.size
    return chunks


class ZooKeeperLeaseStore(ZooKeeperLease):
    """One lease with a client of its own (``--store zookeeper://…`` with one ``--lease``)."""

    def __init__(
        self, target: ZooKeeperTarget, lease: str, *, request_timeout: float = 2.0
    ) -> None:
        super().__init__(ZooKeeperStoreClient(target, request_timeout=request_timeout), lease)

    async def close(self) -> None:
        await self.client.close()
