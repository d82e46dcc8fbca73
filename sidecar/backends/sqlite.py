"""The embedded store: one SQLite file shared by every sidecar on one host.

Expiry is judged on the host's ``CLOCK_BOOTTIME``, which every process on the host shares and
which keeps counting through suspend (rule 2: one host, one clock). The file also records the
kernel's boot id, so a lease written before a reboot counts as expired after it instead of
staying stuck until the new boot's clock catches up. Single-host only: never put the file on a
network filesystem.

Each mutation is one conditional statement inside one ``BEGIN IMMEDIATE`` transaction, so
concurrent processes serialise on SQLite's write lock and the condition is evaluated under it.
``synchronous=FULL`` because a lost commit after a power cut could rewind the term.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sidecar.backends.base import (
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreBehind,
    StoreUnavailable,
)
from sidecar.clock import SYSTEM_CLOCK, Clock

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT,              -- NULL when released
    term        INTEGER NOT NULL,  -- fencing token; kept on release
    duration    REAL NOT NULL,     -- seconds
    expires_at  REAL NOT NULL,     -- CLOCK_BOOTTIME seconds of boot `boot_id`
    boot_id     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    acquired_at TEXT,              -- wall clock, for humans
    renewed_at  TEXT
)
"""

_COLUMNS = (
    "holder, term, duration, max(expires_at - boottime(), 0), version, acquired_at, renewed_at"
)

# Grant if free, expired (on this boot's clock, or written on an earlier boot) or already ours;
# the new term is max(stored, caller's high-water mark) + 1.
_ACQUIRE = f"""
INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                    acquired_at, renewed_at)
VALUES (:name, :holder, :min_term + 1, :duration, boottime() + :duration, :boot_id, 1,
        :wall, :wall)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    term = max(leases.term, :min_term) + 1,
    duration = excluded.duration,
    expires_at = excluded.expires_at,
    boot_id = excluded.boot_id,
    version = leases.version + 1,
    acquired_at = excluded.acquired_at,
    renewed_at = excluded.renewed_at
WHERE leases.holder IS NULL
   OR leases.holder = :holder
   OR leases.boot_id != :boot_id
   OR leases.expires_at <= boottime()
RETURNING {_COLUMNS}
"""

# Extend only our own, unexpired grant of this term.
_RENEW = f"""
UPDATE leases
SET expires_at = boottime() + :duration, duration = :duration, version = version + 1,
    renewed_at = :wall
WHERE name = :name AND holder = :holder AND term = :term
  AND boot_id = :boot_id AND expires_at > boottime()
RETURNING {_COLUMNS}
"""

# Free only our own grant of this term; the term stays so it can never go back.
_RELEASE = f"""
UPDATE leases
SET holder = NULL, expires_at = 0, version = version + 1
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {_COLUMNS}
"""

_READ = f"SELECT {_COLUMNS}, boot_id FROM leases WHERE name = :name"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: there is no reboot detection, the clock alone decides
        return "unknown"


def _wall(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def sqlite_path(url: str) -> str:
    """``sqlite:///./x.db`` → ``./x.db``; ``sqlite:////var/lib/x.db`` → ``/var/lib/x.db``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ValueError("expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    return url[len(prefix) :]


class SQLiteLeaseStore:
    def __init__(
        self,
        path: str,
        name: str,
        *,
        busy_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval: float = 0.05,
    ) -> None:
        self.path = path
        self.name = name
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._watch_interval = watch_interval
        self._boot_id = _boot_id()
        # One thread owns the connection; every statement runs there, off the event loop.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite")
        self._conn: sqlite3.Connection | None = None

    @property
    def description(self) -> str:
        return f"sqlite:///{self.path} lease={self.name}"

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
            try:
                conn.create_function("boottime", 0, self._clock.now)
                self._set_up(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the table. Switching a new file to WAL takes an exclusive lock and,
        unlike ordinary statements, can fail at once with "database is locked" when several
        sidecars start together on a new file: retry that within the busy timeout."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)  # on the store's own thread, never the event loop

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            try:
                return fn(self._connect())
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"name": self.name, "boot_id": self._boot_id, **extra}

    def _record(self, row: tuple[Any, ...] | None) -> LeaseRecord | None:
        if row is None:
            return None
        holder, term, duration, expires_in, version, acquired, renewed = row[:7]
        if len(row) > 7 and row[7] != self._boot_id:
            expires_in = 0.0  # written before the last reboot
        return LeaseRecord(
            holder=holder,
            term=int(term),
            duration=float(duration),
            expires_in=float(expires_in) if holder is not None else 0.0,
            version=str(version),
            acquired_at=_wall(acquired),
            renewed_at=_wall(renewed),
        )

    def _write(
        self, conn: sqlite3.Connection, sql: str, params: dict[str, Any]
    ) -> tuple[LeaseRecord | None, LeaseRecord | None]:
        """Run one conditional statement in its own write transaction.
        Returns (written record, None) or (None, the record that blocked the write)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            written = conn.execute(sql, params).fetchone()
            current = None if written else conn.execute(_READ, params).fetchone()
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return self._record(written), self._record(current)

    # -- the contract ---------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return await self._run(
            lambda conn: self._record(conn.execute(_READ, self._params()).fetchone())
        )

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        params = self._params(
            holder=identity,
            duration=duration,
            min_term=min_term,
            wall=self._clock.wall().isoformat(),
        )

        def acquire(
            conn: sqlite3.Connection,
        ) -> tuple[LeaseRecord | None, LeaseRecord | None, bool]:
            # Under the write lock, the look and the write are one atomic step.
            conn.execute("BEGIN IMMEDIATE")
            try:
                current = self._record(conn.execute(_READ, params).fetchone())
                held = (
                    current is not None
                    and current.holder not in (None, identity)
                    and current.expires_in > 0
                )
                behind = (current.term if current else 0) < min_term and not after_reset
                written = None
                if not (behind or held):  # the statement re-checks "free or expired" itself
                    written = self._record(conn.execute(_ACQUIRE, params).fetchone())
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return written, current, behind and not held

        written, current, behind = await self._run(acquire)
        if written is not None:
            return written
        if behind:
            raise StoreBehind(f"the store's term is below {min_term}: it lost state", current)
        raise LeaseHeld(f"held by {current.holder if current else None}", current)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        params = self._params(
            holder=identity, term=term, duration=duration, wall=self._clock.wall().isoformat()
        )
        written, current = await self._run(lambda conn: self._write(conn, _RENEW, params))
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        params = self._params(holder=identity, term=term)
        written, current = await self._run(lambda conn: self._write(conn, _RELEASE, params))
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Poll ``PRAGMA data_version``, which changes when another connection commits: a
        microsecond local read, so a release is seen within one interval."""
        seen: int | None = None
        while True:
            try:
                version, record = await self._run(self._version_and_record)
            except StoreUnavailable:
                await asyncio.sleep(self._watch_interval * 10)
                continue
            if seen is not None and version != seen:
                yield record
            seen = version
            await asyncio.sleep(self._watch_interval)

    def _version_and_record(self, conn: sqlite3.Connection) -> tuple[int, LeaseRecord | None]:
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return int(version), self._record(conn.execute(_READ, self._params()).fetchone())

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=False)

    def delete_everything(self) -> None:
        """Test and operator helper: drop the lease row, term included (a reset store)."""
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
        try:
            conn.execute("DELETE FROM leases WHERE name = ?", (self.name,))
        finally:
            conn.close()
