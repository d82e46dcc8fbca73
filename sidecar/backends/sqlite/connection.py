"""One SQLite connection on one thread, shared by every lease and registry of a client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sidecar.backends.base import NoStore, StoreUnavailable
from sidecar.backends.sqlite.schema import set_up
from sidecar.backends.sqlite.wake import Notifier
from sidecar.clock import Clock

T = TypeVar("T")

logger = logging.getLogger("sidecar.sqlite")


# Order of the connection's work: a renewal or a release first (a leader's deadline, a hand-off
# someone waits for), then everything else in arrival order, then closing.
URGENT, NORMAL, LAST = 0, 1, 2

_Job = Callable[[], None]


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class Connection:
    """Every statement runs on one thread that owns the connection (sqlite3 connections are
    not for sharing between threads), off the event loop. Opened on first use.

    The thread takes urgent work first: while 1,000 leases are being taken at start-up (each
    a write that may wait for the file lock), a held lease's renewal goes ahead of the queued
    acquires instead of behind them, where it could miss its holder's deadline."""

    def __init__(
        self, path: str, busy_timeout: float, clock: Clock, *, read_only: bool = False
    ) -> None:
        self.path = path
        self.read_only = read_only
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._jobs: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        self._order = itertools.count()  # arrival order within a priority
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self.writes = 0
        """Write calls made through this connection. SQLite's ``data_version`` only moves on
        other connections' commits, so the watch poller also re-reads when this moves: a
        lease's watch must see writes made through a sibling lease of the same client."""
        # What the thread looks at every `interval` seconds between jobs (`on_change`).
        self._probe: tuple[float, Callable[[], None]] | None = None
        self._probe_due = 0.0
        self._probe_seen: tuple[int, int] | None = None  # (data_version, writes) last probed
        # Other processes' watch pollers, told after urgent writes (none from a reader).
        self.notifier = None if read_only else Notifier(path)
        self._notice_owed = False  # an urgent write ran since the last notice

    def on_change(self, interval: float, changed: Callable[[], None] | None) -> None:
        """Every ``interval`` seconds, on the connection's thread and between its jobs, read
        ``PRAGMA data_version`` (a microsecond local read) and call ``changed`` — from that
        thread: it must hand over to its loop itself — when it or `writes` moved since the
        last look, or the read failed. The watch poller then wakes only when the file changed,
        instead of crossing threads every interval to ask. None: stop."""
        self._probe = None if changed is None else (interval, changed)
        self._probe_seen = None
        if changed is not None:
            self._submit(lambda: None, NORMAL)  # the thread starts, and times from now

    def looked(self, version: int, writes: int) -> None:
        """On the connection's thread: the watch poller has just read the file at
        ``data_version`` ``version``, after ``writes`` of this client's writes. The probe then
        wakes it only for what came after: a write another process told of at once (`wake`)
        was otherwise looked at a second time, at the next probe, to find nothing."""
        if self._probe is not None:
            self._probe_seen = (version, writes)

    def _look_for_change(self) -> None:
        probe = self._probe
        if probe is None:
            return
        interval, changed = probe
        self._probe_due = time.monotonic() + interval
        if self._conn is None:
            return  # (opened by the first job, which the poller sends itself)
        writes = self.writes
        try:
            (version,) = self._conn.execute("PRAGMA data_version").fetchone()
            seen: tuple[int, int] | None = (int(version), writes)
        except sqlite3.Error:
            seen = None  # the poller's own read then says what is wrong
        if seen is None or seen != self._probe_seen:
            self._probe_seen = seen
            try:
                changed()
            except Exception:  # never the thread's end: every statement of the client runs on it
                logger.exception("the watch poller's wake-up failed")

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None and self.read_only:
            self._conn = self._connect_read_only()
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
            # Text that is not UTF-8 (a hand edit) arrives with its bad bytes as lone
            # surrogates, for `sidecar.backends.records` to refuse, instead of failing the read
            # of every row beside it.
            conn.text_factory = _decode_text
            try:
                conn.create_function("boottime", 0, self._clock.now)
                set_up(conn, self._busy_timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """For a reader (``status``): never creates the file, the tables, nor migrates an
        older file (`set_up` would do all three), and says "no store" where there is none."""
        path = Path(self.path).absolute()
        if not path.is_file():
            raise NoStore(
                f"no store at {path}: no such file; pass the sidecar's --store (its default, "
                "sqlite:///./leader-sidecar.db, is in the directory the sidecar started in)"
            )
        conn = sqlite3.connect(
            path.as_uri() + "?mode=ro", uri=True, isolation_level=None, timeout=self._busy_timeout
        )
        conn.text_factory = _decode_text
        try:
            conn.execute("PRAGMA temp_store = MEMORY")
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            if not {"leases", "candidates"} <= tables:
                raise NoStore(
                    f"no store at {path}: a SQLite file no sidecar has used "
                    "(is --store the sidecar's?)"
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def _serve(self) -> None:
        while True:
            if self._probe is None:
                _, _, job = self._jobs.get()
            else:
                try:
                    wait = max(0.0, self._probe_due - time.monotonic())
                    _, _, job = self._jobs.get(timeout=wait)
                except queue.Empty:
                    self._look_for_change()
                    continue
            if job is None:
                if self.notifier is not None:
                    if self._notice_owed:  # (a release just before closing, say)
                        self._tell_others()
                    self.notifier.close()
                return
            job()
            if self._notice_owed:
                self._tell_others()
            if self._probe is not None and time.monotonic() >= self._probe_due:
                self._look_for_change()  # (a busy queue still looks every interval)

    def _tell_others(self) -> None:
        """Wake the other processes' pollers at once after an urgent write: a release or a
        hand-over (a successor waits for it), a renewal (followers time the holder by it).
        Other writes are left to the poll, as without wake-ups: acquires come 1,000 at a
        time from every replica at start-up, and the looks they woke took the CPU and the
        connections' threads from those very acquires."""
        self._notice_owed = False
        assert self.notifier is not None
        try:
            self.notifier.notify()
        except Exception:  # never the thread's end: every statement of the client runs on it
            logger.exception("a wake-up notice failed")

    def _submit(self, fn: Callable[[], T], priority: int) -> concurrent.futures.Future[T]:
        """``fn`` on the connection's thread; the future is cancelled, not run, if its caller
        gave up before its turn (as a thread pool does)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="sqlite", daemon=True)
            self._thread.start()
        self._jobs.put((priority, next(self._order), job))
        return future

    async def run(
        self, fn: Callable[[sqlite3.Connection], T], *, writes: bool = False, urgent: bool = False
    ) -> T:
        """Run ``fn`` on the connection's thread; SQLite errors become `StoreUnavailable`.
        ``urgent``: ahead of all work that is not (see the class)."""

        def call() -> T:
            try:
                return fn(self._connect())
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite {self.path}: {exc}") from exc
            finally:
                if writes and urgent and self.notifier is not None:
                    self._notice_owed = True  # (even on failure: a commit may have landed)

        try:
            return await asyncio.wrap_future(self._submit(call, URGENT if urgent else NORMAL))
        finally:
            if writes:  # counted even on failure: a commit may land before an error
                self.writes += 1

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.wrap_future(self._submit(shut, LAST))
        self._jobs.put((LAST, next(self._order), None))  # then the thread ends
