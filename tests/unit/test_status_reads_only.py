"""``leader-sidecar status`` is a reader (issue 32): it never creates or changes a store, says
"no store at PATH" with a non-zero exit where there is none (it printed ``default - - none``
and "no candidates registered", exit 0, after creating an empty ``./leader-sidecar.db``), and
its one line about a store that does not answer is the only line. Real processes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from sidecar.backends.base import Candidate
from sidecar.backends.sqlite import SQLiteStoreClient
from tests.unit.test_config import run_cli


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_status_where_there_is_no_store_says_so_creates_nothing_and_fails(tmp_path: Path) -> None:
    result = run_cli("status", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"leader-sidecar status: no store at {tmp_path / 'leader-sidecar.db'}: no such file; "
        "pass the sidecar's --store (its default, sqlite:///./leader-sidecar.db, is in the "
        "directory the sidecar started in)"
    ]
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_status_on_a_sqlite_file_no_sidecar_used_says_no_store_and_leaves_it_alone(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    result = run_cli("status", "--store", f"sqlite:///{empty}")
    assert result.returncode == 1
    assert result.stderr.startswith(f"leader-sidecar status: no store at {empty}: ")
    assert empty.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_status_reads_a_store_without_changing_a_byte_of_it(tmp_path: Path) -> None:
    db = tmp_path / "leases.db"

    async def one_candidate() -> None:
        client = SQLiteStoreClient(str(db))
        await client.candidates("default").beat(Candidate("a_1", "7"), 15.0)
        await client.close()

    asyncio.run(one_candidate())
    before = digest(db)
    result = run_cli("status", "--store", f"sqlite:///{db}", "-o", "json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert [c["identity"] for c in status["candidates"]] == ["a_1"]
    assert [lease["state"] for lease in status["leases"]] == ["none"]
    assert digest(db) == before


def test_status_of_a_store_that_does_not_answer_prints_one_line(tmp_path: Path) -> None:
    """Not a stray "redis unavailable" from the client's log before the real error."""
    result = run_cli("status", "--store", "redis://127.0.0.1:1/0", "--request-timeout", "1s")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("leader-sidecar status: the store did not answer: redis ")


def test_status_reads_a_file_from_before_the_app_column_without_migrating_it(
    tmp_path: Path,
) -> None:
    """A file a sidecar of an older version wrote (no ``app`` column in ``candidates``): the
    reader shows its candidates with no app state, and changes nothing."""
    import sqlite3

    db = tmp_path / "leases.db"

    async def one_candidate() -> None:
        client = SQLiteStoreClient(str(db))
        await client.candidates("default").beat(Candidate("a_1", "7"), 15.0)
        await client.close()

    asyncio.run(one_candidate())
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE candidates DROP COLUMN app")
    before = digest(db)
    result = run_cli("status", "--store", f"sqlite:///{db}", "-o", "json")
    assert result.returncode == 0, result.stderr
    (candidate,) = json.loads(result.stdout)["candidates"]
    assert (candidate["identity"], candidate["app"]) == ("a_1", None)
    assert digest(db) == before
