"""One SQLite connection on one thread, shared by every lease and registry of a client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.sqlite.schema import set_up
from sidecar.clock import Clock

T = TypeVar("T")


class Connection:
    """Every statement runs on one thread that owns the connection (sqlite3 connections are
    not for sharing between threads), off the event loop. Opened on first use."""

    def __init__(self, path: str, busy_timeout: float, clock: Clock) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite")
        self._conn: sqlite3.Connection | None = None
        self.writes = 0
        """Write calls made through this connection. SQLite's ``data_version`` only moves on
        other connections' commits, so the watch poller also re-reads when this moves: a
        lease's watch must see writes made through a sibling lease of the same client."""

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
            try:
                conn.create_function("boottime", 0, self._clock.now)
                set_up(conn, self._busy_timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, writes: bool = False) -> T:
        """Run ``fn`` on the connection's thread; SQLite errors become `StoreUnavailable`."""

        def call() -> T:
            try:
                return fn(self._connect())
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        finally:
            if writes:  # counted even on failure: a commit may land before an error
                self.writes += 1

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=False)
