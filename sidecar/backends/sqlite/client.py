"""`SQLiteStoreClient`: every lease and candidate group a sidecar keeps in one SQLite file, on
the one connection, thread and change poller of a `database.SQLiteDatabase`."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from sidecar.backends.base import NotOwned, Renewal, RenewalOutcome, lost_grant
from sidecar.backends.sqlite.candidates import SQLiteCandidates
from sidecar.backends.sqlite.database import SQLiteDatabase
from sidecar.backends.sqlite.lease import SQLiteLease
from sidecar.backends.sqlite.schema import (
    READ_MANY,
    RENEW_MANY,
    RESTORE,
    lease_record,
    transaction,
)
from sidecar.clock import SYSTEM_CLOCK, Clock


class SQLiteStoreClient(SQLiteDatabase):
    """The `StoreClient` of one SQLite file: its leases and candidate groups, and their
    renewals in one transaction."""

    def lease(self, name: str) -> SQLiteLease:
        return SQLiteLease(self, name)

    def candidates(self, group: str) -> SQLiteCandidates:
        return SQLiteCandidates(self, group)

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """Every renewal in one transaction (`RenewsMany`): one statement renews the leases
        still ours; the others are read, and put back where the store lost them."""
        if not renewals:
            return []
        wall = self.clock.wall().isoformat()
        batch = json.dumps([[r.name, r.identity, r.term, r.duration] for r in renewals])

        def renew(conn: sqlite3.Connection) -> list[RenewalOutcome]:
            with transaction(conn):
                params = {"batch": batch, "boot_id": self.boot_id, "wall": wall}
                renewed = {row[0]: row[1:] for row in conn.execute(RENEW_MANY, params)}
                missed = [r.name for r in renewals if r.name not in renewed]
                found = {}
                if missed:
                    rows = conn.execute(READ_MANY, {"names": json.dumps(missed)})
                    found = {row[0]: lease_record(row[1:]) for row in rows}
                outcomes: list[RenewalOutcome] = []
                for r in renewals:
                    if r.name in renewed:
                        outcomes.append(_record(renewed[r.name]))
                        continue
                    current = found.get(r.name)
                    if lost_grant(current, r.term):
                        restore = {
                            "name": r.name, "holder": r.identity, "term": r.term,
                            "duration": r.duration, "boot_id": self.boot_id, "wall": wall,
                        }  # fmt: skip
                        outcomes.append(_record(conn.execute(RESTORE, restore).fetchone()))
                    else:
                        message = f"not held by {r.identity} with term {r.term}"
                        outcomes.append(NotOwned(message, current))
            return outcomes

        return await self.connection.run(renew, writes=True, urgent=True)


class SQLiteLeaseStore(SQLiteLease):
    """One lease with a client of its own: the single-lease form (tests, the chaos suite,
    benchmarks, and one sidecar per lease). Closing it closes its client."""

    def __init__(
        self,
        path: str,
        name: str,
        *,
        busy_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval: float = 0.05,
    ) -> None:
        client = SQLiteStoreClient(
            path, busy_timeout=busy_timeout, clock=clock, watch_interval=watch_interval
        )
        super().__init__(client, name)

    async def close(self) -> None:
        await super().close()
        await self.client.close()


def _record(row: Sequence[object]) -> RenewalOutcome:
    record = lease_record(row)
    assert record is not None
    return record
