"""`PostgresStoreClient`: the leases and candidate groups of one PostgreSQL database, and their
renewals in one statement, on the pool, LISTEN session and epoch of a
`connection.PostgresConnection`."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from sidecar.backends.base import MAX_BATCH, NotOwned, Renewal, RenewalOutcome
from sidecar.backends.kit.versions import new_version
from sidecar.backends.postgresql import schema
from sidecar.backends.postgresql.candidates import PostgresCandidates
from sidecar.backends.postgresql.connection import PostgresConnection
from sidecar.backends.postgresql.lease import PostgresLease
from sidecar.backends.postgresql.target import PostgresTarget
from sidecar.clock import SYSTEM_CLOCK, Clock


class PostgresStoreClient(PostgresConnection):
    """The `StoreClient` of one PostgreSQL database."""

    def lease(self, name: str) -> PostgresLease:
        return PostgresLease(self, name)

    def candidates(self, group: str) -> PostgresCandidates:
        return PostgresCandidates(self, group)

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """Every renewal in one statement (`RenewsMany`): each lease renewed while still ours,
        else put back where the store lost it, else NotOwned with what is there."""
        if not renewals:
            return []
        assert len(renewals) <= MAX_BATCH
        names = [r.name for r in renewals]

        async def work(connection: asyncpg.Connection) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await connection.fetch(
                schema.RENEW_MANY, names, [r.identity for r in renewals],
                [r.term for r in renewals], [r.duration for r in renewals],
                [new_version() for _ in renewals], self.clock.wall(),
            )  # fmt: skip
            return rows

        rows = {row["name"]: row for row in await self.run(work)}
        tag = self.tag()
        outcomes: list[RenewalOutcome] = []
        for r in renewals:
            row = rows.get(r.name)
            record = schema.lease_record(row, tag)
            if row is not None and row["written"]:
                assert record is not None
                outcomes.append(record)
            else:
                message = f"not held by {r.identity} with term {r.term}"
                outcomes.append(NotOwned(message, record))
        return outcomes


class PostgresLeaseStore(PostgresLease):
    """One lease with a client of its own (tests, the chaos suite, one sidecar per lease).
    Closing it closes its client."""

    def __init__(
        self,
        target: PostgresTarget,
        name: str,
        *,
        request_timeout: float = 2.0,
        application_name: str = "leader-sidecar",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        client = PostgresStoreClient(
            target, request_timeout=request_timeout, application_name=application_name,
            clock=clock,
        )  # fmt: skip
        super().__init__(client, name)

    async def close(self) -> None:
        await super().close()
        await self.client.close()
