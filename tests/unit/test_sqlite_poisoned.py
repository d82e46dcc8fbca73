"""A hand-edited SQLite file (issue 25): any column of a lease or candidate row may hold any
type — a BLOB, text in an integer column, text that is not UTF-8, a term of 2^63 - 1. Each
reads as a record that cannot be read (a lease: unknown holder; a candidate: left out), never
as an error; the poller keeps running; and the lease can still be taken over, conditionally
on exactly what is stored, with a term the file can hold."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from sidecar.backends.base import Candidate, LeaseHeld
from sidecar.backends.records import MAX_TERM
from sidecar.backends.sqlite import SQLiteStoreClient
from sidecar.candidates import CandidateView

LEASE = 30.0


def hand_edit(path: Path, statement: str, *params: object) -> None:
    """What an operator with the sqlite3 shell does: no version change, no transaction of
    ours."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


POISONS = {
    "term-2^63-1": ("UPDATE leases SET term = ?", 2**63 - 1),
    "term-text": ("UPDATE leases SET term = ?", "abc"),
    "term-past-bound": ("UPDATE leases SET term = ?", MAX_TERM + 1),
    "holder-blob": ("UPDATE leases SET holder = ?", b"\xff\x00"),
    "holder-not-utf8": ("UPDATE leases SET holder = CAST(? AS TEXT)", b"app\xff"),
    "holder-escape": ("UPDATE leases SET holder = ?", "app\x1b]0;owned\x07"),
    "duration-text": ("UPDATE leases SET duration = ?", "long"),
    "holder-blob-version-text": ("UPDATE leases SET holder = ?, version = 'abc'", b"\xff"),
    "term-text-version-blob": ("UPDATE leases SET term = 'x', version = ?", b"\x00\x01"),
}


async def test_a_version_a_hand_edit_left_is_still_one_version_to_take_over(
    tmp_path: Path,
) -> None:
    """Versions are integers this code makes; text or a BLOB there is named by a digest of
    exactly what is stored, so a takeover stays conditional on it."""
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        lease = client.lease("jobs")
        await lease.try_acquire("a_1", LEASE, 0, expected=None)
        hand_edit(path, "UPDATE leases SET version = ?", b"\x00\x01")
        blob = await lease.read()
        hand_edit(path, "UPDATE leases SET version = 'abc'")
        text = await lease.read()
        assert blob is not None
        assert text is not None
        assert blob.version.startswith("raw:")
        assert text.version.startswith("raw:")
        assert blob.version != text.version
        with pytest.raises(LeaseHeld):
            await lease.try_acquire("b_1", LEASE, 1, expected=blob.version)
        taken = await lease.try_acquire("b_1", LEASE, 1, expected=text.version)
        assert (taken.holder, taken.term) == ("b_1", 2)
    finally:
        await client.close()


@pytest.mark.parametrize("poison", POISONS, ids=list(POISONS))
async def test_a_poisoned_lease_row_is_unknown_and_taken_over_only_over_its_version(
    tmp_path: Path, poison: str
) -> None:
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        lease = client.lease("jobs")
        granted = await lease.try_acquire("a_1", LEASE, 0, expected=None)
        records = lease.watch()
        assert (await asyncio.wait_for(anext(records), 5.0)) is not None
        statement, value = POISONS[poison]
        hand_edit(path, statement, value)
        seen = await asyncio.wait_for(anext(records), 5.0)  # the poller read it and lives
        assert seen is not None
        assert seen.unreadable is not None
        assert (seen.holder, seen.term, seen.free, seen.forgotten) == (None, 0, False, False)
        assert await lease.read() == seen
        with pytest.raises(LeaseHeld):  # not over anything else
            await lease.try_acquire("b_1", LEASE, 5, expected=granted.version + "0")
        taken = await lease.try_acquire("b_1", LEASE, 1 + 1000, expected=seen.version)
        assert (taken.holder, taken.unreadable) == ("b_1", None)
        assert taken.term == 1002  # above the caller's floor; nothing overflowed
        assert (await asyncio.wait_for(anext(records), 5.0)) == taken
        await records.aclose()
    finally:
        await client.close()


async def test_a_renewal_over_a_poisoned_row_changes_nothing_and_says_not_owned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        lease = client.lease("jobs")
        granted = await lease.try_acquire("a_1", LEASE, 0, expected=None)
        hand_edit(path, "UPDATE leases SET term = ?", 2**63 - 1)
        from sidecar.backends.base import NotOwned

        with pytest.raises(NotOwned) as refused:  # never put back over what it cannot read
            await lease.renew("a_1", granted.term, LEASE)
        assert refused.value.record is not None
        assert refused.value.record.unreadable is not None
        [outcome] = await client.renew_many([_renewal("jobs", granted.term)])
        assert isinstance(outcome, NotOwned)
    finally:
        await client.close()


def _renewal(name: str, term: int) -> object:
    from sidecar.backends.base import Renewal

    return Renewal(name, "a_1", term, LEASE)


async def test_a_timestamp_nobody_can_read_leaves_the_record_readable(tmp_path: Path) -> None:
    """``renewed_at = 'garbage'`` once killed the poller of every sidecar on the file."""
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        lease = client.lease("jobs")
        granted = await lease.try_acquire("a_1", LEASE, 0, expected=None)
        records = lease.watch()
        await asyncio.wait_for(anext(records), 5.0)
        hand_edit(path, "UPDATE leases SET renewed_at = 'garbage', acquired_at = X'FF'")
        seen = await asyncio.wait_for(anext(records), 5.0)
        assert seen is not None
        assert (seen.holder, seen.term, seen.unreadable) == ("a_1", granted.term, None)
        assert seen.ignored is not None
        assert "renewed_at" in seen.ignored
        renewed = await lease.renew("a_1", granted.term, LEASE)
        assert renewed.renewed_at is not None
        await records.aclose()
    finally:
        await client.close()


async def test_poisoned_candidate_rows_are_left_out_and_the_beat_goes_on(tmp_path: Path) -> None:
    """``priority = 'abc'``, a BLOB identity, ``started_at = 'not-a-date'``: each once killed
    the candidate heartbeat of every sidecar on the file."""
    path = tmp_path / "leases.db"
    client = SQLiteStoreClient(str(path), busy_timeout=5.0)
    try:
        group = client.candidates("jobs")
        await group.beat(Candidate("a_1", "11"), LEASE)
        now = "2026-12-02T09:00:00.000000+00:00"
        insert = (
            'INSERT INTO candidates ("group", identity, revision, priority, leaving, '
            "started_at, beat_at, version) VALUES ('jobs', ?, '', ?, 0, ?, ?, ?)"
        )
        hand_edit(path, insert, b"\xff\x00", 0, None, now, 1)
        hand_edit(path, insert, "ghost-priority", "abc", None, now, 2)
        hand_edit(path, insert, "ghost-started", 0, "not-a-date", now, 3)
        found = {c.identity: c for c in await group.list()}
        assert found["a_1"].unreadable is None
        assert found["ghost-priority"].unreadable is not None
        assert "priority" in found["ghost-priority"].unreadable
        blob = next(c for c in found.values() if c.identity.startswith("\\xff"))
        assert blob.unreadable is not None
        assert found["ghost-started"].unreadable is None  # a date for humans: ignored
        assert found["ghost-started"].started_at is None
        view = CandidateView(Candidate("a_1", "11"), LEASE)
        view.observe([c for c in found.values() if c.unreadable is None], at=0.0)
        assert [c.identity for c in view.live(1.0)] == ["a_1"]
        await group.beat(Candidate("a_1", "12"), LEASE)  # the beat goes on
    finally:
        await client.close()
