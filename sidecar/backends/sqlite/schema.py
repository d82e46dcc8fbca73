"""The SQLite store's tables and statements. Each mutation is one conditional statement, run
inside one ``BEGIN IMMEDIATE`` transaction by `sidecar.backends.sqlite.lease`."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import LOST_HOLDER, LeaseRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT,              -- NULL when released
    term        INTEGER NOT NULL,  -- fencing token; kept on release
    duration    REAL NOT NULL,     -- seconds
    expires_at  REAL NOT NULL,     -- CLOCK_BOOTTIME seconds of boot `boot_id`
    boot_id     TEXT NOT NULL,
    version     INTEGER NOT NULL,
    acquired_at TEXT,              -- wall clock, for humans
    renewed_at  TEXT,
    successor   TEXT,              -- named by a release; meaningful only while released
    handed      TEXT               -- set by a hand-over until the holder renews
)
"""

# Files written before hand-overs lack the columns: added in place, rows and terms kept.
ADD_SUCCESSOR = "ALTER TABLE leases ADD COLUMN successor TEXT"
ADD_HANDED = "ALTER TABLE leases ADD COLUMN handed TEXT"
# A candidate's app state (up, down, or '' without an app check), for `status`.
ADD_APP = "ALTER TABLE candidates ADD COLUMN app TEXT NOT NULL DEFAULT ''"

CANDIDATES_SCHEMA = """
CREATE TABLE IF NOT EXISTS candidates (
    "group"    TEXT NOT NULL,
    identity   TEXT NOT NULL,
    revision   TEXT NOT NULL,
    priority   INTEGER NOT NULL,
    leaving    INTEGER NOT NULL,   -- 0/1
    started_at TEXT,               -- wall clock, for humans and ordering among equals
    beat_at    TEXT NOT NULL,      -- wall clock of the last beat: humans and garbage collection
    version    INTEGER NOT NULL,   -- new on every beat; liveness is observed from it
    app        TEXT NOT NULL DEFAULT '',  -- up | down | '' (no app check): for humans
    PRIMARY KEY ("group", identity)
)
"""

COLUMNS = "holder, term, duration, version, acquired_at, renewed_at, successor, handed"

# A new version on every write: random, so a version never comes back even after the row was
# deleted and written again (an increment would restart at 1).
NEW_VERSION = "abs(random())"

# Grant: the caller names the version it observed (rule 2); the statement re-checks it under
# the write lock (``:expected`` is the version as stored, whatever its type). The new term,
# max(stored, caller's floor) + 1, is worked out from the row read under the same lock
# (`sidecar.backends.sqlite.lease`): a stored term that is not one (a hand edit) counts as 0.
# A grant ends a hand-over.
ACQUIRE = f"""
INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                    acquired_at, renewed_at, successor)
VALUES (:name, :holder, :term, :duration, boottime() + :duration, :boot_id,
        {NEW_VERSION}, :wall, :wall, NULL)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    term = excluded.term,
    duration = excluded.duration,
    expires_at = excluded.expires_at,
    boot_id = excluded.boot_id,
    version = excluded.version,
    acquired_at = excluded.acquired_at,
    renewed_at = excluded.renewed_at,
    successor = NULL,
    handed = NULL
WHERE leases.version = :expected
RETURNING {COLUMNS}
"""

# Extend only our own grant of this term.
RENEW = f"""
UPDATE leases
SET expires_at = boottime() + :duration, duration = :duration, version = {NEW_VERSION},
    boot_id = :boot_id, renewed_at = :wall, handed = NULL
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {COLUMNS}
"""

# Many renewals in one statement (`RenewsMany`): ``:batch`` is a JSON array of
# ``[name, holder, term, duration]``, one per lease; each row is renewed under exactly RENEW's
# condition, independently of the others. The leases it did not renew are then read (and put
# back, where the store lost them) in the same transaction.
RENEW_MANY = f"""
UPDATE leases
SET expires_at = boottime() + batch.duration, duration = batch.duration,
    version = {NEW_VERSION}, boot_id = :boot_id, renewed_at = :wall, handed = NULL
FROM (SELECT json_extract(value, '$[0]') AS name, json_extract(value, '$[1]') AS holder,
             json_extract(value, '$[2]') AS term, json_extract(value, '$[3]') AS duration
      FROM json_each(:batch)) AS batch
WHERE leases.name = batch.name AND leases.holder = batch.holder AND leases.term = batch.term
RETURNING name, {COLUMNS}
"""

# The row is gone, or rewound to an older term (a file restored from a backup): put our grant
# back. Only ever run after reading, under the same write lock, that this is the case.
RESTORE = f"""
INSERT OR REPLACE INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                               acquired_at, renewed_at, successor, handed)
VALUES (:name, :holder, :term, :duration, boottime() + :duration, :boot_id, {NEW_VERSION},
        :wall, :wall, NULL, NULL)
RETURNING {COLUMNS}
"""

# Write down a loss a follower saw (see the contract's ``mark_lost``): only where there is no
# row, or a row of a lower term that is no operator's hold (:hold). Stored under `LOST_HOLDER`
# (a NULL holder means released).
MARK_LOST = f"""
INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                    acquired_at, renewed_at, successor)
VALUES (:name, :lost, :term, :duration, 0, :boot_id, {NEW_VERSION}, NULL, :wall, NULL)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    term = excluded.term,
    duration = excluded.duration,
    expires_at = excluded.expires_at,
    version = excluded.version,
    acquired_at = excluded.acquired_at,
    renewed_at = excluded.renewed_at,
    successor = NULL,
    handed = NULL
WHERE leases.term < excluded.term
  AND NOT (coalesce(leases.holder, '') = :hold
           OR substr(coalesce(leases.holder, ''), 1, length(:hold) + 1) = :hold || ' ')
RETURNING {COLUMNS}
"""

# Free only our own grant of this term; the term stays so it can never go back. A NULL holder
# is only ever written here, so it always means "released".
RELEASE = f"""
UPDATE leases
SET holder = NULL, expires_at = 0, version = {NEW_VERSION}, successor = :successor,
    handed = NULL
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {COLUMNS}
"""

# Release and grant in one statement: our own grant of this term goes to the successor with
# the next term, carrying the successor's candidate version it was chosen by (`handed`).
HAND_OVER = f"""
UPDATE leases
SET holder = :successor, term = max(term, :min_term) + 1, duration = :duration,
    expires_at = boottime() + :duration, boot_id = :boot_id, version = {NEW_VERSION},
    acquired_at = :wall, renewed_at = :wall, successor = NULL, handed = :handed
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {COLUMNS}
"""

READ = f"SELECT {COLUMNS} FROM leases WHERE name = :name"

# Every watched lease of a client in one statement: ``:names`` is a JSON array, so a thousand
# names are one parameter, and each is looked up by the primary key.
READ_MANY = f"""
SELECT name, {COLUMNS} FROM leases
WHERE name IN (SELECT value FROM json_each(:names))
"""

# The watch poller's copy of every watched row (`sidecar.backends.sqlite.watch`): a table of
# its own connection (``temp``: never in the file, never seen by another connection), so that
# SQLite itself finds the rows that changed since the last look and only those are read.
# ``present``: 1 a row, 0 none, -1 not known yet (a new watch: read its row whatever it is).
# Declared as in ``leases``, so each value is kept exactly as read.
WATCHED = """
CREATE TEMP TABLE IF NOT EXISTS sidecar_watched (
    name TEXT PRIMARY KEY, present INTEGER NOT NULL, holder TEXT, term INTEGER, duration REAL,
    version INTEGER, acquired_at TEXT, renewed_at TEXT, successor TEXT, handed TEXT
) WITHOUT ROWID
"""
# ``:names``: a JSON array (a thousand new watches are one statement).
WATCHED_NEW = """
INSERT OR REPLACE INTO temp.sidecar_watched (name, present)
SELECT value, -1 FROM json_each(:names)
"""
WATCHED_FORGET = """
DELETE FROM temp.sidecar_watched WHERE name IN (SELECT value FROM json_each(:names))
"""
_COLUMN_NAMES = [column.strip() for column in COLUMNS.split(",")]
# Every column compared by value and kind (IS: NULL is NULL), the row's presence too: a hand
# edit that leaves the version as it was is still a change.
_SAME = " AND ".join(f"l.{column} IS w.{column}" for column in _COLUMN_NAMES)
_DIFFERS = f"NOT (w.present = (l.name IS NOT NULL) AND (l.name IS NULL OR ({_SAME})))"
_LIVE = f"""
SELECT w.name AS name, l.name IS NOT NULL AS present,
       {", ".join(f"l.{column} AS {column}" for column in _COLUMN_NAMES)}
FROM temp.sidecar_watched AS w LEFT JOIN main.leases AS l ON l.name = w.name
WHERE {_DIFFERS}
"""
# The watched rows that differ from the copy: (name, present, COLUMNS...).
WATCHED_CHANGED = _LIVE
# Then the copy takes them, in the same read transaction (the same rows, as read above).
WATCHED_SEEN = f"""
UPDATE temp.sidecar_watched
SET present = live.present, {", ".join(f"{column} = live.{column}" for column in _COLUMN_NAMES)}
FROM ({_LIVE}) AS live
WHERE sidecar_watched.name = live.name
"""

CANDIDATE_COLUMNS = "identity, version, revision, priority, leaving, started_at, beat_at, app"

BEAT = f"""
INSERT INTO candidates ("group", identity, revision, priority, leaving, started_at, beat_at,
                        version, app)
VALUES (:group, :identity, :revision, :priority, :leaving, :started_at, :beat_at,
        coalesce(:version, {NEW_VERSION}), :app)
ON CONFLICT ("group", identity) DO UPDATE SET
    revision = excluded.revision,
    priority = excluded.priority,
    leaving = excluded.leaving,
    app = excluded.app,
    started_at = excluded.started_at,
    beat_at = excluded.beat_at,
    version = excluded.version
"""

# Garbage collection only (by wall clock, written by the beaters themselves): liveness is
# observed by readers from versions, never from these timestamps.
FORGET_SILENT = """
DELETE FROM candidates WHERE "group" = :group AND beat_at < :cutoff
"""

LIST = f"""
SELECT {CANDIDATE_COLUMNS} FROM candidates WHERE "group" = :group ORDER BY identity
"""

# A file written before the app column, read by a command that never migrates (`status`).
LIST_WITHOUT_APP = f"""
SELECT {CANDIDATE_COLUMNS.removesuffix(", app")}, '' FROM candidates WHERE "group" = :group
ORDER BY identity
"""

LEAVE = """
DELETE FROM candidates WHERE "group" = :group AND identity = :identity
"""


# How often a writer waiting for the file's write lock tries again.
LOCK_RETRY = 0.001


def _begin(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, trying again every millisecond until the busy timeout. SQLite's own
    busy handler backs off up to 100 ms between tries, so with several sidecars writing at
    once (1,000 leases taken at start-up) a waiting writer keeps losing the lock to the others
    and a renewal can wait seconds; short, even tries keep the wait near the others' commits."""
    (timeout_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()
    deadline = time.monotonic() + timeout_ms / 1000
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(LOCK_RETRY)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: under SQLite's write lock, a look and a write are atomic."""
    _begin(conn)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def set_up(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """WAL mode, the tables, and the migration of an older file. Switching a new file to WAL
    takes an exclusive lock and, unlike ordinary statements, can fail at once with "database
    is locked" when several sidecars start together on a new file: retry that within the busy
    timeout. Runs on the connection's own thread, never the event loop."""
    # The watch poller's copy of the watched rows (``WATCHED``) and the transient tables its
    # statements build are kept in memory: as files they go to /var/tmp or /tmp from about
    # 2,500 leases, which the chart's read-only root filesystem does not have (every look
    # then fails with "disk I/O error"). 1.6 MiB at 10,000 leases. Before any temp table: a
    # change drops them.
    conn.execute("PRAGMA temp_store = MEMORY")
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            # Under the write lock, so two sidecars starting on an old file do not both add
            # the column (the second would fail with "duplicate column").
            with transaction(conn):
                conn.execute(SCHEMA)
                columns = {row[1] for row in conn.execute("PRAGMA table_info(leases)")}
                if "successor" not in columns:
                    conn.execute(ADD_SUCCESSOR)
                if "handed" not in columns:
                    conn.execute(ADD_HANDED)
                conn.execute(CANDIDATES_SCHEMA)
                candidate_columns = {
                    row[1] for row in conn.execute("PRAGMA table_info(candidates)")
                }
                if "app" not in candidate_columns:
                    conn.execute(ADD_APP)
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def lease_record(row: Sequence[Any] | None) -> LeaseRecord | None:
    """A row of ``COLUMNS`` as the contract's record, checked (`sidecar.backends.records`):
    any column may hold any type after a hand edit."""
    if row is None:
        return None
    holder, term, duration, version, acquired, renewed, successor, handed = row
    released = holder is None  # a NULL holder is only ever written by a release
    if holder == LOST_HOLDER:  # a loss marker: no holder, not released
        holder = None
    return records.lease_record(
        holder=holder,
        term=term,
        duration=duration,
        version=version_key(version),
        released=released,
        # Only a release names a successor; a grant by an earlier version of the sidecar
        # (sharing the file during an upgrade) does not clear the column, so ignore it there.
        successor=successor if released else None,
        handed=handed if holder is not None else None,
        acquired_at=acquired,
        renewed_at=renewed,
    )


def version_key(stored: object) -> str:
    """The version the contract reports for a stored one: the number as it is (every
    version this code writes is an integer), or for anything else a hand edit left there a
    digest of its type and value — exactly one key per stored value, so that such a row can
    still be taken over conditionally."""
    if type(stored) is int:
        return str(stored)
    digest = hashlib.sha256(f"{type(stored).__name__}:{stored!r}".encode("utf-8", "replace"))
    return "raw:" + digest.hexdigest()[:32]


def stored_term(row: Sequence[Any] | None) -> int:
    """The term in a row if it is one a grant could have written, else 0 (a hand edit): what
    the next grant counts up from, beside the caller's floor."""
    term = row[1] if row is not None else 0
    return term if type(term) is int and 0 <= term <= records.MAX_TERM else 0
