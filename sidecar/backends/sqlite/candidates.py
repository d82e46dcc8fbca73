"""The candidate registry of one group, in the SQLite file's ``candidates`` table."""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sidecar.backends import records
from sidecar.backends.base import Candidate
from sidecar.backends.sqlite.schema import (
    BEAT,
    FORGET_SILENT,
    LEAVE,
    LIST,
    LIST_WITHOUT_APP,
    transaction,
)

if TYPE_CHECKING:
    from sidecar.backends.sqlite.database import SQLiteDatabase

# Records not beaten for this many leases are deleted by the next beat in their group. Wall
# clock, so only garbage collection: a reader judges liveness from versions (rule 2).
FORGET_AFTER_LEASES = 20


def _stamp(moment: datetime) -> str:
    """One fixed format in UTC, so the stored stamps compare as strings (for the GC)."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


class SQLiteCandidates:
    def __init__(self, client: SQLiteDatabase, group: str) -> None:
        self.client = client
        self.group = group

    async def beat(self, candidate: Candidate, duration: float) -> None:
        await self._beat(candidate, duration, listing=False)

    async def beat_and_list(self, candidate: Candidate, duration: float) -> list[Candidate]:
        """`ListsOnBeat`: the beat and the read in one transaction."""
        return _candidates(await self._beat(candidate, duration, listing=True))

    async def _beat(self, candidate: Candidate, duration: float, *, listing: bool) -> list[Any]:
        now = self.client.clock.wall()
        params: dict[str, Any] = {
            "group": self.group,
            "identity": candidate.identity,
            # The replica's own version when it is a number (it always is: see `Candidate`).
            "version": int(candidate.version) if candidate.version.isdigit() else None,
            "revision": candidate.revision,
            "priority": candidate.priority,
            "leaving": int(candidate.leaving),
            "app": candidate.app,
            "started_at": _stamp(candidate.started_at) if candidate.started_at else None,
            "beat_at": _stamp(now),
            "cutoff": _stamp(now - timedelta(seconds=FORGET_AFTER_LEASES * duration)),
        }

        def beat(conn: sqlite3.Connection) -> list[Any]:
            with transaction(conn):
                conn.execute(FORGET_SILENT, params)
                conn.execute(BEAT, params)
                if not listing:
                    return []
                return conn.execute(LIST, {"group": self.group}).fetchall()

        return await self.client.connection.run(beat)

    async def list(self) -> list[Candidate]:
        def fetch(conn: sqlite3.Connection) -> list[Any]:
            try:
                return conn.execute(LIST, {"group": self.group}).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such column: app" not in str(exc):
                    raise
                # A file no sidecar of this version has opened yet (`status` never migrates).
                return conn.execute(LIST_WITHOUT_APP, {"group": self.group}).fetchall()

        return _candidates(await self.client.connection.run(fetch))

    async def leave(self, identity: str) -> None:
        params = {"group": self.group, "identity": identity}

        def leave(conn: sqlite3.Connection) -> None:
            with transaction(conn):
                conn.execute(LEAVE, params)

        await self.client.connection.run(leave)

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """Not followed: the file has no notifications, and polling the group as often as
        the leases would double the poller's work for a read saved at each hand-over."""
        return
        yield  # type: ignore[unreachable]  # an async generator that yields nothing

    def following(self) -> bool:
        return False


def _candidates(rows: list[Any]) -> list[Candidate]:
    return [  # checked: after a hand edit any column may hold any type
        records.candidate(
            identity=identity,
            version=str(version) if type(version) is int else version,
            revision=revision,
            priority=priority,
            leaving=leaving,
            started_at=started_at,
            beat_at=beat_at,
            app=app,
        )
        for identity, version, revision, priority, leaving, started_at, beat_at, app in rows
    ]
