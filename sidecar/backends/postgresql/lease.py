"""One lease in PostgreSQL: the contract's requests, one conditional statement each (rule 1),
and its watch. Everything it talks through — the pool, the LISTEN hub, the epoch — belongs to
its `PostgresConnection`, shared by every lease."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg

from sidecar.backends import records
from sidecar.backends.base import HOLD_HOLDER, LeaseHeld, LeaseRecord, NotOwned, lost_grant
from sidecar.backends.kit.subscription import Subscription
from sidecar.backends.kit.versions import new_version
from sidecar.backends.postgresql import schema
from sidecar.backends.postgresql.connection import PostgresConnection
from sidecar.backends.records import check_term


class PostgresLease:
    """The lease ``name`` on ``client``; cheap to make, no I/O until used."""

    def __init__(self, client: PostgresConnection, name: str) -> None:
        self.client = client
        self.name = name
        self._watches: set[Subscription] = set()

    @property
    def description(self) -> str:
        return f"{self.client.description} lease={self.name}"

    def _wall(self) -> datetime:
        return self.client.clock.wall()

    def _record(self, row: asyncpg.Record | None) -> LeaseRecord | None:
        return schema.lease_record(row, self.client.tag())

    async def _fetch(self, statement: str, *args: object) -> LeaseRecord | None:
        async def work(connection: asyncpg.Connection) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await connection.fetchrow(statement, self.name, *args)
            return row

        return self._record(await self.client.run(work))

    # -- the contract ---------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return await self._fetch(schema.READ)

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        if expected is None:
            written = await self._fetch(
                schema.ACQUIRE_NEW, identity, duration, min_term, new_version(), self._wall()
            )
        else:
            stored = self.client.untagged(expected)
            if stored is None:
                # Observed before the server may have lost writes: not a basis for a grant.
                current = await self.read()
                raise LeaseHeld("the lease was observed before the store reconnected", current)
            written = await self._fetch(
                schema.ACQUIRE, identity, duration, min_term, new_version(), self._wall(), stored
            )
        if written is not None:
            return written
        current = await self.read()
        if (current.version if current is not None else None) == expected:
            # Nothing else changed: the grant would have passed what the store holds.
            check_term(records.MAX_TERM + 1, records.MAX_TERM, self.description)
        raise LeaseHeld(f"the lease is not at version {expected}", current)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        written = await self._fetch(
            schema.RENEW, identity, term, duration, new_version(), self._wall()
        )
        if written is not None:
            return written
        current = await self.read()
        if lost_grant(current, term):
            # The store lost our grant (a failover, a restore, a deleted row): put it back —
            # one conditional statement, which re-checks the loss and that no later grant was
            # made, so a concurrent grant is never overwritten.
            written = await self._fetch(
                schema.RESTORE, identity, term, duration, new_version(), self._wall()
            )
            if written is not None:
                return written
            current = await self.read()
        raise NotOwned(f"not held by {identity} with term {term}", current)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        written = await self._fetch(
            schema.RELEASE, identity, term, new_version(), successor, self._wall()
        )
        if written is not None:
            return written
        raise NotOwned(f"not held by {identity} with term {term}", await self.read())

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
        written = await self._fetch(
            schema.HAND_OVER, identity, term, successor, duration, min_term, new_version(),
            self._wall(), handed,
        )  # fmt: skip
        if written is not None:
            return written
        current = await self.read()
        if current is not None and (current.holder, current.term) == (identity, term):
            # Still ours: the grant would have passed what the store holds.
            check_term(records.MAX_TERM + 1, records.MAX_TERM, self.description)
        raise NotOwned(f"not held by {identity} with term {term}", current)

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        written = await self._fetch(
            schema.MARK_LOST, term, duration, new_version(), self._wall(), HOLD_HOLDER
        )
        return written if written is not None else await self.read()

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield the record once the client's LISTEN session is up (and again after every
        reconnection), then every write as it commits, until cancelled or closed."""
        watch = self.client.hub.watch(self.name)
        self._watches.add(watch)
        try:
            async for record in watch.records():
                yield record
        finally:
            self._watches.discard(watch)
            self.client.hub.unwatch(watch)

    async def close(self) -> None:
        """End this lease's watches; the connections belong to the client."""
        for watch in list(self._watches):
            self.client.hub.unwatch(watch)

    async def delete_everything(self) -> None:
        """Test and operator helper: forget the lease, its term included (a reset store)."""

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(schema.DELETE, self.name)

        await self.client.run(work)
