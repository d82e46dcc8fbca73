"""One lease in the SQLite store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sidecar.backends.base import (
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreUnavailable,
)
from sidecar.backends.sqlite.schema import (
    ACQUIRE,
    READ,
    RELEASE,
    RENEW,
    RESTORE,
    SCHEMA,
)
from sidecar.clock import SYSTEM_CLOCK, Clock

T = TypeVar("T")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux; only earlier versions of the sidecar read it
        return "unknown"


def _stored_version(version: str | None) -> int | str | None:
    """Versions are integers in the file; compare like with like."""
    if version is not None and version.lstrip("-").isdigit():
        return int(version)
    return version


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
                conn.execute(SCHEMA)
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
        holder, term, duration, version, acquired, renewed = row
        return LeaseRecord(
            holder=holder,
            term=int(term),
            duration=float(duration),
            version=str(version),
            released=holder is None,  # a NULL holder is only ever written by a release
            acquired_at=_wall(acquired),
            renewed_at=_wall(renewed),
        )

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
        """One write transaction: under SQLite's write lock, a look and a write are atomic."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _write(
        self, conn: sqlite3.Connection, sql: str, params: dict[str, Any]
    ) -> tuple[LeaseRecord | None, LeaseRecord | None]:
        """Run one conditional statement in its own write transaction.
        Returns (written record, None) or (None, the record that blocked the write)."""
        with self._transaction(conn):
            written = conn.execute(sql, params).fetchone()
            current = None if written else conn.execute(READ, params).fetchone()
        return self._record(written), self._record(current)

    # -- the contract ---------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        return await self._run(
            lambda conn: self._record(conn.execute(READ, self._params()).fetchone())
        )

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        params = self._params(
            holder=identity,
            duration=duration,
            min_term=min_term,
            expected=_stored_version(expected),
            wall=self._clock.wall().isoformat(),
        )

        def acquire(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with self._transaction(conn):
                current = self._record(conn.execute(READ, params).fetchone())
                written = None
                if (current.version if current else None) == expected:
                    written = self._record(conn.execute(ACQUIRE, params).fetchone())
            return written, current

        written, current = await self._run(acquire)
        if written is not None:
            return written
        raise LeaseHeld(f"the lease is not at version {expected}", current)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        params = self._params(
            holder=identity, term=term, duration=duration, wall=self._clock.wall().isoformat()
        )

        def renew(conn: sqlite3.Connection) -> tuple[LeaseRecord | None, LeaseRecord | None]:
            with self._transaction(conn):
                written = self._record(conn.execute(RENEW, params).fetchone())
                current = None
                if written is None:
                    current = self._record(conn.execute(READ, params).fetchone())
                    if current is None or current.term < term:  # the store lost our grant
                        written = self._record(conn.execute(RESTORE, params).fetchone())
            return written, current

        written, current = await self._run(renew)
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        params = self._params(holder=identity, term=term)
        written, current = await self._run(lambda conn: self._write(conn, RELEASE, params))
        if written is None:
            raise NotOwned(f"not held by {identity} with term {term}", current)
        return written

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield the record now, then poll ``PRAGMA data_version``, which changes when another
        connection commits: a microsecond local read, so every write is seen within one
        interval."""
        seen: int | None = None
        while True:
            try:
                version, record = await self._run(self._version_and_record)
            except StoreUnavailable:
                await asyncio.sleep(self._watch_interval * 10)
                continue
            if version != seen:
                yield record
            seen = version
            await asyncio.sleep(self._watch_interval)

    def _version_and_record(self, conn: sqlite3.Connection) -> tuple[int, LeaseRecord | None]:
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return int(version), self._record(conn.execute(READ, self._params()).fetchone())

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
