"""The PostgreSQL store's schema and statements. Each ownership step is one conditional
statement (rule 1); a trigger announces every change of a lease row with ``NOTIFY`` in the
same transaction.

Two tables per lease, on purpose:

* ``leases`` — the record: holder, term, lease duration, version (new on every write),
  released, successor, handed, and wall-clock stamps for humans. Every write goes here.
* ``grants`` — one row per lease holding the term of its newest grant, written *only* by a
  grant (acquire, hand-over, a holder putting its forgotten grant back). The app's fence
  (``leader_sidecar.fence``) takes a share lock on this row, so a grant of a newer term waits
  until every transaction that passed the fence has ended, while renewals, which never touch
  this row, are never delayed by a long app transaction.

Versions are random tokens made by the client (never reused, also after a deleted row), so
"the same version" means "nothing was written in between". The stamps are the sidecar's wall
clock, for humans and garbage collection: no statement compares a time to decide a grant
(rule 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import Candidate, LeaseRecord
from sidecar.backends.records import MAX_TERM

SCHEMA = "leader_sidecar"
CHANNEL = "leader_sidecar"  # one LISTEN for every lease and candidate group

# Bumped when the DDL changes; `setup` creates or migrates up to it.
SCHEMA_VERSION = 1

# Taken (transaction-scoped) around creating the schema, so sidecars starting together on a
# new database do not race on CREATE (which fails with a unique violation, not IF NOT EXISTS).
SETUP_LOCK = 0x6C65_6164_6572  # "leader"

# Every object the store needs; `exists` tells whether a database has them all.
DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};

CREATE TABLE IF NOT EXISTS {SCHEMA}.leases (
    name        text PRIMARY KEY,
    holder      text,                          -- NULL: released, or a loss marker
    term        bigint NOT NULL,               -- the fencing token of the latest grant
    duration    double precision NOT NULL,     -- seconds, as the holder wrote it
    version     text NOT NULL,                 -- new on every write; observers compare it
    released    boolean NOT NULL DEFAULT false,
    successor   text,                          -- named by a release; only while released
    handed      text,                          -- set by a hand-over until the holder renews
    acquired_at timestamptz,                   -- wall clock, for humans
    renewed_at  timestamptz
);

CREATE TABLE IF NOT EXISTS {SCHEMA}.grants (
    name text PRIMARY KEY,
    term bigint NOT NULL                       -- the newest grant's term; only grants write it
);

CREATE TABLE IF NOT EXISTS {SCHEMA}.candidates (
    group_name text NOT NULL,
    identity   text NOT NULL,
    version    text NOT NULL,                  -- new on every beat; liveness is observed from it
    revision   text NOT NULL,
    priority   integer NOT NULL,
    leaving    boolean NOT NULL,
    started_at timestamptz,
    beat_at    timestamptz NOT NULL,           -- wall clock: humans and garbage collection
    PRIMARY KEY (group_name, identity)
);

-- Every change of a lease row, announced in the writer's transaction: the record itself, so
-- followers need no read. A deleted row (an operator, a test) is announced too.
CREATE OR REPLACE FUNCTION {SCHEMA}.announce_lease() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{CHANNEL}', json_build_object('lease', OLD.name, 'deleted', true)::text);
    ELSE
        PERFORM pg_notify('{CHANNEL}', json_build_object(
            'lease', NEW.name, 'holder', NEW.holder, 'term', NEW.term,
            'duration', NEW.duration, 'version', NEW.version, 'released', NEW.released,
            'successor', NEW.successor, 'handed', NEW.handed,
            'acquired_at', NEW.acquired_at, 'renewed_at', NEW.renewed_at)::text);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {SCHEMA}.announce_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', json_build_object('truncated', true)::text);
    RETURN NULL;
END $$;

-- A join, a leave, or a change of what a hand-over chooses by (not every beat).
CREATE OR REPLACE FUNCTION {SCHEMA}.announce_candidate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', json_build_object(
        'group', CASE WHEN TG_OP = 'DELETE' THEN OLD.group_name ELSE NEW.group_name END)::text);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS announce ON {SCHEMA}.leases;
CREATE TRIGGER announce AFTER INSERT OR UPDATE OR DELETE ON {SCHEMA}.leases
    FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.announce_lease();
DROP TRIGGER IF EXISTS announce_truncate ON {SCHEMA}.leases;
CREATE TRIGGER announce_truncate AFTER TRUNCATE ON {SCHEMA}.leases
    FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.announce_truncate();
DROP TRIGGER IF EXISTS announce ON {SCHEMA}.candidates;
CREATE TRIGGER announce AFTER INSERT OR DELETE ON {SCHEMA}.candidates
    FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.announce_candidate();
DROP TRIGGER IF EXISTS announce_change ON {SCHEMA}.candidates;
CREATE TRIGGER announce_change AFTER UPDATE ON {SCHEMA}.candidates
    FOR EACH ROW WHEN ((OLD.revision, OLD.priority, OLD.leaving)
                       IS DISTINCT FROM (NEW.revision, NEW.priority, NEW.leaving))
    EXECUTE FUNCTION {SCHEMA}.announce_candidate();

-- The fence for the app's own transactions: fails unless `term` is the lease's newest grant
-- and that grant still holds (not released, not lost). The share lock on the grant row makes
-- a grant of a newer term wait until the caller's transaction ends (commit or rollback), so a
-- write that passed the fence never commits after a newer grant has. SECURITY DEFINER: the
-- caller needs EXECUTE only, never a privilege on the tables (a share lock needs UPDATE).
CREATE OR REPLACE FUNCTION {SCHEMA}.fence(lease text, term bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    granted bigint;
    held {SCHEMA}.leases%ROWTYPE;
BEGIN
    SELECT g.term INTO granted FROM {SCHEMA}.grants g WHERE g.name = lease FOR SHARE;
    IF granted IS DISTINCT FROM term THEN
        RAISE EXCEPTION 'leader_sidecar.fence: term % is not the newest grant of lease % (%)',
            term, lease, coalesce(granted::text, 'never granted')
            USING ERRCODE = 'LS001',
                  HINT = 'This replica is not the leader with this term any more: roll back.';
    END IF;
    SELECT * INTO held FROM {SCHEMA}.leases l WHERE l.name = lease;
    IF held.term IS DISTINCT FROM term OR held.holder IS NULL THEN
        RAISE EXCEPTION 'leader_sidecar.fence: the grant of term % of lease % was released',
            term, lease
            USING ERRCODE = 'LS001',
                  HINT = 'This replica is not the leader with this term any more: roll back.';
    END IF;
    RETURN term;
END $$;
REVOKE ALL ON FUNCTION {SCHEMA}.fence(text, bigint) FROM PUBLIC;
"""

# The version the objects above are at, as the schema's comment (readable by anyone, one
# round trip with the rest of `INSPECT`); later versions migrate from it.
MARK_VERSION = f"COMMENT ON SCHEMA {SCHEMA} IS 'leader-sidecar schema version {SCHEMA_VERSION}'"

TABLES = ("leases", "grants", "candidates")

# In one round trip: whether every object exists at this version, and the privileges the role
# lacks on the tables that exist. Run once per client before its first statement: a missing
# schema is created (if the role may), a missing privilege is reported by name.
INSPECT = f"""
SELECT to_regclass('{SCHEMA}.leases') IS NOT NULL
   AND to_regclass('{SCHEMA}.grants') IS NOT NULL
   AND to_regclass('{SCHEMA}.candidates') IS NOT NULL
   AND to_regprocedure('{SCHEMA}.fence(text,bigint)') IS NOT NULL
   AND obj_description(to_regnamespace('{SCHEMA}'), 'pg_namespace')
       = 'leader-sidecar schema version {SCHEMA_VERSION}' AS complete,
   array(
       SELECT t.name || ' (' || p.privilege || ')'
       FROM (VALUES ('leases'), ('grants'), ('candidates')) AS t(name),
            (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE')) AS p(privilege)
       WHERE NOT has_table_privilege(to_regclass('{SCHEMA}.' || t.name), p.privilege)
       ORDER BY 1
   ) AS missing
"""


def sidecar_grants(role: str) -> list[str]:
    """The sidecar's least privileges on the objects (``role``: a quoted identifier, see
    `quote_ident`): read and write its three tables, nothing else. LISTEN and NOTIFY need no
    privilege."""
    return [
        f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {SCHEMA}.leases, {SCHEMA}.grants, "
        f"{SCHEMA}.candidates TO {role}",
    ]


def fence_grants(role: str) -> list[str]:
    """What an app's ``role`` needs to call the fence: the schema and the function, no table
    (the function runs with its owner's rights)."""
    return [
        f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}",
        f"GRANT EXECUTE ON FUNCTION {SCHEMA}.fence(text, bigint) TO {role}",
    ]


def quote_ident(name: str) -> str:
    """A role name as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


COLUMNS = "holder, term, duration, version, released, successor, handed, acquired_at, renewed_at"
L_COLUMNS = ", ".join(f"l.{column}" for column in COLUMNS.split(", "))  # the same, of alias l

# -- the lease statements ($1 is always the lease's name) --------------------------------------

# A stored term a grant could have written, else 0 (a hand edit: `records.MAX_TERM` bounds
# every term, and one of 2^63 - 1 would overflow the next grant). Every grant counts up from
# these, and writes nothing past MAX_TERM: the statement then changes nothing, and the caller
# tells that apart from a lost race by reading (`lease.TermExhausted`).
_SANE = f"BETWEEN 0 AND {MAX_TERM}"
_GRANTED = f"(SELECT coalesce(max(g.term) FILTER (WHERE g.term {_SANE}), 0) FROM {SCHEMA}.grants g WHERE g.name = $1)"  # noqa: E501

# Grant over "nothing stored at all" (rule 1): only where no row exists. The term is above the
# grant row's (a row someone deleted from `leases` alone) and the caller's floor (rule 5).
# $2 holder, $3 duration, $4 min_term, $5 new version, $6 wall time.
ACQUIRE_NEW = f"""
WITH floor AS (
    SELECT greatest(coalesce(max(term) FILTER (WHERE term {_SANE}), 0), $4::bigint) AS term
    FROM {SCHEMA}.grants WHERE name = $1
), granted AS (
    INSERT INTO {SCHEMA}.leases (name, holder, term, duration, version, released,
                                 acquired_at, renewed_at)
    SELECT $1, $2, floor.term + 1, $3, $5, false, $6, $6 FROM floor
    WHERE floor.term < {MAX_TERM}
    ON CONFLICT (name) DO NOTHING
    RETURNING name, {COLUMNS}
), fenced AS (
    INSERT INTO {SCHEMA}.grants (name, term) SELECT name, term FROM granted
    ON CONFLICT (name) DO UPDATE SET term = excluded.term
)
SELECT {COLUMNS} FROM granted
"""

# Grant over exactly the version the caller watched (rule 1 and 2): the row is re-checked under
# its lock, so a renewal or another grant in between leaves nothing to update. The new term is
# max(stored, grant row, caller's floor) + 1 (rule 5). A grant ends a release's successor and a
# hand-over's mark. The grant row is raised in the same statement: it waits for every app
# transaction that passed the fence at an older term.
# $2 holder, $3 duration, $4 min_term, $5 new version, $6 wall time, $7 expected version.
ACQUIRE = f"""
WITH granted AS (
    UPDATE {SCHEMA}.leases AS l
    SET holder = $2,
        term = greatest(CASE WHEN l.term {_SANE} THEN l.term ELSE 0 END, $4::bigint,
                        {_GRANTED}) + 1,
        duration = $3, version = $5, released = false, successor = NULL, handed = NULL,
        acquired_at = $6, renewed_at = $6
    WHERE l.name = $1 AND l.version = $7
      AND greatest(CASE WHEN l.term {_SANE} THEN l.term ELSE 0 END, $4::bigint,
                   {_GRANTED}) < {MAX_TERM}
    RETURNING l.name, {COLUMNS}
), fenced AS (
    INSERT INTO {SCHEMA}.grants (name, term) SELECT name, term FROM granted
    ON CONFLICT (name) DO UPDATE SET term = excluded.term
)
SELECT {COLUMNS} FROM granted
"""

# Extend only our own grant of this term. Never touches the grant row (see the module).
# $2 holder, $3 term, $4 duration, $5 new version, $6 wall time.
RENEW = f"""
UPDATE {SCHEMA}.leases
SET duration = $4, version = $5, renewed_at = $6, handed = NULL
WHERE name = $1 AND holder = $2 AND term = $3
RETURNING {COLUMNS}
"""

# Put back a grant the store lost (`base.lost_grant`): no row, a row of a lower term, or a loss
# marker of this very term — and never where a later grant was made (the grant row). One
# conditional statement; the grant row is raised back to the term.
# $2 holder, $3 term, $4 duration, $5 new version, $6 wall time.
RESTORE = f"""
WITH restored AS (
    INSERT INTO {SCHEMA}.leases AS l (name, holder, term, duration, version, released,
                                      acquired_at, renewed_at)
    SELECT $1, $2, $3, $4, $5, false, $6, $6
    WHERE NOT EXISTS (SELECT 1 FROM {SCHEMA}.grants g WHERE g.name = $1 AND g.term > $3)
    ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder, term = excluded.term, duration = excluded.duration,
        version = excluded.version, released = false, successor = NULL, handed = NULL,
        acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at
    WHERE l.term < excluded.term
       OR (l.term = excluded.term AND l.holder IS NULL AND NOT l.released)
    RETURNING l.name, {COLUMNS}
), fenced AS (
    INSERT INTO {SCHEMA}.grants AS g (name, term) SELECT name, term FROM restored
    ON CONFLICT (name) DO UPDATE SET term = excluded.term WHERE g.term < excluded.term
)
SELECT {COLUMNS} FROM restored
"""

# Many renewals in one statement (`RenewsMany`): each lease exactly as its own RENEW, else its
# own RESTORE (the same conditions), else what is there. The batch is five parallel arrays:
# $1 names, $2 holders, $3 terms, $4 durations, $5 new versions; $6 wall time. A lease's row
# is modified by one CTE at most (the restore skips what the renewal matched).
RENEW_MANY = f"""
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[], $5::text[])
        AS b(name, holder, term, duration, version)
), renewed AS (
    UPDATE {SCHEMA}.leases AS l
    SET duration = b.duration, version = b.version, renewed_at = $6, handed = NULL
    FROM batch b
    WHERE l.name = b.name AND l.holder = b.holder AND l.term = b.term
    RETURNING l.name, {L_COLUMNS}
), restored AS (
    INSERT INTO {SCHEMA}.leases AS l (name, holder, term, duration, version, released,
                                      acquired_at, renewed_at)
    SELECT b.name, b.holder, b.term, b.duration, b.version, false, $6, $6 FROM batch b
    WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.name = b.name)
      AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.grants g WHERE g.name = b.name AND g.term > b.term)
    ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder, term = excluded.term, duration = excluded.duration,
        version = excluded.version, released = false, successor = NULL, handed = NULL,
        acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at
    WHERE l.term < excluded.term
       OR (l.term = excluded.term AND l.holder IS NULL AND NOT l.released)
    RETURNING l.name, {L_COLUMNS}
), fenced AS (
    INSERT INTO {SCHEMA}.grants AS g (name, term) SELECT name, term FROM restored
    ON CONFLICT (name) DO UPDATE SET term = excluded.term WHERE g.term < excluded.term
)
SELECT true AS written, name, {COLUMNS} FROM renewed
UNION ALL
SELECT true, name, {COLUMNS} FROM restored
UNION ALL
SELECT false, l.name, {L_COLUMNS}
FROM {SCHEMA}.leases l JOIN batch b ON l.name = b.name
WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.name = l.name)
  AND NOT EXISTS (SELECT 1 FROM restored r WHERE r.name = l.name)
"""

# Free only our own grant of this term; the term stays, so it can never go back. The grant
# row is not touched: a release is not a grant (the next grant waits for the fence instead).
# $2 holder, $3 term, $4 new version, $5 successor (or NULL), $6 wall time.
RELEASE = f"""
UPDATE {SCHEMA}.leases
SET holder = NULL, released = true, version = $4, successor = $5, handed = NULL,
    renewed_at = $6
WHERE name = $1 AND holder = $2 AND term = $3
RETURNING {COLUMNS}
"""

# Release and grant in one statement: our grant of this term goes to the successor with the
# next term, carrying the successor's candidate version it was chosen by.
# $2 holder, $3 term, $4 successor, $5 duration, $6 min_term, $7 new version, $8 wall time,
# $9 handed.
HAND_OVER = f"""
WITH granted AS (
    UPDATE {SCHEMA}.leases AS l
    SET holder = $4,
        term = greatest(l.term, $6::bigint, {_GRANTED}) + 1,
        duration = $5, version = $7, released = false, successor = NULL, handed = $9,
        acquired_at = $8, renewed_at = $8
    WHERE l.name = $1 AND l.holder = $2 AND l.term = $3
      AND greatest(l.term, $6::bigint, {_GRANTED}) < {MAX_TERM}
    RETURNING l.name, {COLUMNS}
), fenced AS (
    INSERT INTO {SCHEMA}.grants (name, term) SELECT name, term FROM granted
    ON CONFLICT (name) DO UPDATE SET term = excluded.term
)
SELECT {COLUMNS} FROM granted
"""

# Write down a loss a follower saw (the contract's ``mark_lost``): only where there is no row,
# or a row of a lower term that is no operator's hold. Over a grant, the fence refuses its
# holder at once (the row's holder is NULL).
# $2 term, $3 duration, $4 new version, $5 wall time, $6 the holder of an operator's hold.
MARK_LOST = f"""
INSERT INTO {SCHEMA}.leases AS l (name, holder, term, duration, version, released, renewed_at)
VALUES ($1, NULL, $2, $3, $4, false, $5)
ON CONFLICT (name) DO UPDATE
SET holder = NULL, term = excluded.term, duration = excluded.duration,
    version = excluded.version, acquired_at = NULL, renewed_at = excluded.renewed_at,
    released = false, successor = NULL, handed = NULL
WHERE l.term < excluded.term
  AND (l.holder IS NULL
       OR NOT (l.holder = $6::text OR left(l.holder, length($6::text) + 1) = $6::text || ' '))
RETURNING {COLUMNS}
"""

READ = f"SELECT {COLUMNS} FROM {SCHEMA}.leases WHERE name = $1"

# Every watched lease in one statement, by primary key.
READ_MANY = f"SELECT name, {COLUMNS} FROM {SCHEMA}.leases WHERE name = ANY($1::text[])"

# Operators and tests: forget a lease entirely, its term included (a reset store).
DELETE = f"""
WITH gone AS (DELETE FROM {SCHEMA}.leases WHERE name = $1)
DELETE FROM {SCHEMA}.grants WHERE name = $1
"""

# -- the candidate statements -----------------------------------------------------------------

CANDIDATE_COLUMNS = "identity, version, revision, priority, leaving, started_at, beat_at"

# A beat, with the group's garbage collection (by the writer's wall clock: only GC; readers
# judge liveness from versions, rule 2). The trigger announces joins and changes.
# $1 group, $2 identity, $3 version, $4 revision, $5 priority, $6 leaving, $7 started_at,
# $8 beat_at, $9 cutoff.
BEAT = f"""
WITH forgotten AS (
    DELETE FROM {SCHEMA}.candidates
    WHERE group_name = $1 AND identity <> $2 AND beat_at < $9
)
INSERT INTO {SCHEMA}.candidates AS c (group_name, identity, version, revision, priority,
                                      leaving, started_at, beat_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (group_name, identity) DO UPDATE
SET version = excluded.version, revision = excluded.revision, priority = excluded.priority,
    leaving = excluded.leaving, started_at = excluded.started_at, beat_at = excluded.beat_at
"""

LIST = f"""
SELECT {CANDIDATE_COLUMNS} FROM {SCHEMA}.candidates WHERE group_name = $1 ORDER BY identity
"""

LEAVE = f"DELETE FROM {SCHEMA}.candidates WHERE group_name = $1 AND identity = $2"


# -- decoding ---------------------------------------------------------------------------------


def lease_record(row: Mapping[str, Any] | None, version_tag: str = "") -> LeaseRecord | None:
    """A row of ``COLUMNS`` (or a notification's JSON object) as the contract's record,
    checked (`sidecar.backends.records`: the columns are typed, but a hand edit can still put
    a term past what a grant writes, text with control characters, a NaN lease). A record
    that cannot be read keeps its stored version: a takeover is conditional on it.
    ``version_tag`` is appended to the stored version (the client's epoch)."""
    if row is None:
        return None
    released = row["released"]
    holder = row["holder"]
    return records.lease_record(
        holder=holder,
        term=row["term"],
        duration=row["duration"],
        version=f"{row['version']}{version_tag}",
        released=released is True and holder is None,
        successor=row["successor"] if released is True else None,
        handed=row["handed"] if holder is not None else None,
        acquired_at=row["acquired_at"],
        renewed_at=row["renewed_at"],
    )


def candidate(row: Mapping[str, Any]) -> Candidate:
    """A candidate row, checked; one that cannot be read is left out by the reader."""
    return records.candidate(
        identity=row["identity"],
        version=row["version"],
        revision=row["revision"],
        priority=row["priority"],
        leaving=row["leaving"],
        started_at=row["started_at"],
        beat_at=row["beat_at"],
    )
