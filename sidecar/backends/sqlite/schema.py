"""The SQLite store's table and statements. Each mutation is one conditional statement,
run inside one ``BEGIN IMMEDIATE`` transaction by `sidecar.backends.sqlite.lease`."""

from __future__ import annotations

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
    renewed_at  TEXT
)
"""

COLUMNS = "holder, term, duration, version, acquired_at, renewed_at"

# A new version on every write: random, so a version never comes back even after the row was
# deleted and written again (an increment would restart at 1).
NEW_VERSION = "abs(random())"

# Grant: the caller names the version it observed (rule 2); the statement re-checks it under
# the write lock. The new term is max(stored, caller's floor) + 1.
ACQUIRE = f"""
INSERT INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                    acquired_at, renewed_at)
VALUES (:name, :holder, :min_term + 1, :duration, boottime() + :duration, :boot_id,
        {NEW_VERSION}, :wall, :wall)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    term = max(leases.term, :min_term) + 1,
    duration = excluded.duration,
    expires_at = excluded.expires_at,
    boot_id = excluded.boot_id,
    version = excluded.version,
    acquired_at = excluded.acquired_at,
    renewed_at = excluded.renewed_at
WHERE leases.version = :expected
RETURNING {COLUMNS}
"""

# Extend only our own grant of this term.
RENEW = f"""
UPDATE leases
SET expires_at = boottime() + :duration, duration = :duration, version = {NEW_VERSION},
    boot_id = :boot_id, renewed_at = :wall
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {COLUMNS}
"""

# The row is gone, or rewound to an older term (a file restored from a backup): put our grant
# back. Only ever run after reading, under the same write lock, that this is the case.
RESTORE = f"""
INSERT OR REPLACE INTO leases (name, holder, term, duration, expires_at, boot_id, version,
                               acquired_at, renewed_at)
VALUES (:name, :holder, :term, :duration, boottime() + :duration, :boot_id, {NEW_VERSION},
        :wall, :wall)
RETURNING {COLUMNS}
"""

# Free only our own grant of this term; the term stays so it can never go back. A NULL holder
# is only ever written here, so it always means "released".
RELEASE = f"""
UPDATE leases
SET holder = NULL, expires_at = 0, version = {NEW_VERSION}
WHERE name = :name AND holder = :holder AND term = :term
RETURNING {COLUMNS}
"""

READ = f"SELECT {COLUMNS} FROM leases WHERE name = :name"
