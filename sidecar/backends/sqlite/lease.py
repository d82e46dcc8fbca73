"""One lease in the SQLite store, on its client's shared connection and poller."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from sidecar.backends.base import (
    HOLD_HOLDER,
    LOST_HOLDER,
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    lost_grant,
)
from sidecar.backends.kit.subscription import Subscription
from sidecar.backends.records import MAX_TERM, check_term
from sidecar.backends.sqlite.schema import (
    ACQUIRE,
    HAND_OVER,
    MARK_LOST,
    READ,
    RELEASE,
    RENEW,
    RESTORE,
    lease_record,
    stored_term,
    transaction,
)

if TYPE_CHECKING:
    from sidecar.backends.sqlite.database import SQLiteDatabase


class SQLiteLease:
    """The lease ``name``; cheap to make. Every statement goes through the client's one
    connection, and every watch through its one poller."""

    def __init__(self, client: SQLiteDatabase, name: str) -> None:
        self.client = client
        self.name = name
        self._watches: set[Subscription] | None = None  # made at the first watch (~0.2 KB)

    @property
    def path(self) -> str:
        return self.client.path

    @property
    def description(self) -> str:
        return f"sqlite:///{self.path} lease={self.name}"

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"name": self.name, "boot_id": self.client.boot_id, **extra}

    def _wall(self) -> str:
        return self.client.clock.wall().isoformat()

    # -- the contract ---------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return await self.client.connection.run(
            lambda conn: lease_record(conn.execute(READ, self._params()).fetchone())
        )

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        params = self._params(holder=identity, duration=duration, wall=self._wall())

        def acquire(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with transaction(conn):
                row = conn.execute(READ, params).fetchone()
                current = lease_record(row)
                written = None
                if (current.version if current else None) == expected:
                    stored = stored_term(row)
                    term = check_term(max(stored, min_term) + 1, MAX_TERM, self.description)
                    grant = {**params, "term": term, "expected": row[3] if row else None}
                    written = lease_record(conn.execute(ACQUIRE, grant).fetchone())
            return written, current

        written, current = await self.client.connection.run(acquire, writes=True)
        if written is not None:
            return written
        raise LeaseHeld(f"the lease is not at version {expected}", current)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        params = self._params(holder=identity, term=term, duration=duration, wall=self._wall())

        def renew(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with transaction(conn):
                written = lease_record(conn.execute(RENEW, params).fetchone())
                current = None
                if written is None:
                    current = lease_record(conn.execute(READ, params).fetchone())
                    if lost_grant(current, term):
                        written = lease_record(conn.execute(RESTORE, params).fetchone())
            return written, current

        written, current = await self.client.connection.run(renew, writes=True, urgent=True)
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        params = self._params(
            lost=LOST_HOLDER, hold=HOLD_HOLDER, term=term, duration=duration, wall=self._wall()
        )

        def mark(conn: sqlite3.Connection) -> LeaseRecord | None:
            with transaction(conn):
                written = conn.execute(MARK_LOST, params).fetchone()
                row = written if written else conn.execute(READ, params).fetchone()
            return lease_record(row)

        return await self.client.connection.run(mark, writes=True)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        params = self._params(holder=identity, term=term, successor=successor)

        def release(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with transaction(conn):
                written = conn.execute(RELEASE, params).fetchone()
                current = None if written else conn.execute(READ, params).fetchone()
            return lease_record(written), lease_record(current)

        written, current = await self.client.connection.run(release, writes=True, urgent=True)
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

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
        params = self._params(
            holder=identity,
            term=term,
            successor=successor,
            handed=handed,
            duration=duration,
            min_term=min_term,
            wall=self._wall(),
        )

        check_term(max(term, min_term) + 1, MAX_TERM, self.description)

        def hand_over(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with transaction(conn):
                written = conn.execute(HAND_OVER, params).fetchone()
                current = None if written else conn.execute(READ, params).fetchone()
            return lease_record(written), lease_record(current)

        written, current = await self.client.connection.run(hand_over, writes=True, urgent=True)
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield the record now, then whenever the client's poller sees its version change
        (including a deleted row), until cancelled or closed."""
        watch = self._subscribe(None)
        try:
            async for record in watch.records():
                yield record
        finally:
            self._unsubscribe(watch)

    def follow(self, callback: Callable[[LeaseRecord | None], None]) -> Callable[[], None]:
        """`watch` as calls of ``callback`` on the poller's task (`FollowsByCall`)."""
        watch = self._subscribe(callback)
        return lambda: self._unsubscribe(watch)

    def _subscribe(self, callback: Callable[[LeaseRecord | None], None] | None) -> Subscription:
        watch = self.client.hub.subscribe(self.name, callback)
        if self._watches is None:
            self._watches = set()
        self._watches.add(watch)
        return watch

    def _unsubscribe(self, watch: Subscription) -> None:
        if self._watches is not None:
            self._watches.discard(watch)
        self.client.hub.unsubscribe(watch)

    async def close(self) -> None:
        """End this lease's watches; the connection belongs to the client."""
        for watch in list(self._watches or ()):
            self.client.hub.unsubscribe(watch)

    def delete_everything(self) -> None:
        """Test and operator helper: drop the lease row, term included (a reset store). On a
        connection of its own, so it works from any thread."""
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.client.busy_timeout)
        try:
            conn.execute("DELETE FROM leases WHERE name = ?", (self.name,))
        finally:
            conn.close()
