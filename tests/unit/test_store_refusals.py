"""A store that can never work is refused at start, naming ``--store`` (issue 32): a path in
/proc or /sys, a directory, a file that is not a SQLite database. Before, the sidecar bound
both ports, answered ``/healthz`` 200 and logged "unable to open database file" every retry
for ever. A file that may become usable is not judged (a new path is created on first use)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sidecar.config import load
from sidecar.config_error import ConfigError
from tests.unit.test_config import run_cli


def refusal(store: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(["--store", store], environ={})
    return str(caught.value)


@pytest.mark.parametrize(
    ("path", "wanted"),
    [
        ("/proc/x.db", "/proc is a kernel filesystem, not a place for a database"),
        ("/sys/kernel/x.db", "/sys is a kernel filesystem, not a place for a database"),
        ("/proc", "/proc is a kernel filesystem, not a place for a database"),
    ],
)
def test_a_path_in_a_kernel_filesystem_is_refused(path: str, wanted: str) -> None:
    assert (
        refusal(f"sqlite:///{path}") == f"--store=sqlite:///{path}: {wanted}; pick a path on disk"
    )


def test_a_link_into_proc_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "kernel").symlink_to("/proc/self")
    assert "/proc is a kernel filesystem" in refusal(f"sqlite:///{tmp_path}/kernel/x.db")


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    assert refusal(f"sqlite:///{notes}") == (
        f"--store=sqlite:///{notes}: {notes} is not a SQLite database; point --store at the "
        "sidecar's database or at a path that does not exist yet"
    )
    assert notes.read_text() == "not a database\n"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert "exists and is not a regular file" in refusal(f"sqlite:///{tmp_path}")


def test_a_new_path_an_empty_file_and_a_database_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "empty.db").write_bytes(b"")  # SQLite makes an empty file a database
    sqlite3.connect(tmp_path / "used.db").execute("CREATE TABLE t (a)").connection.close()
    for name in ("new.db", "empty.db", "used.db"):
        store = f"sqlite:///{tmp_path / name}"
        assert load(["--store", store], environ={}).store == store


def test_the_sidecar_stops_at_start_with_one_line_and_exit_2() -> None:
    """Before binding anything: no listener, no retry loop."""
    result = run_cli("--store", "sqlite:////proc/x.db", "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "leader-sidecar: --store=sqlite:////proc/x.db: /proc is a kernel filesystem, not a "
        "place for a database; pick a path on disk"
    ]


def test_a_loop_of_links_is_refused_not_followed_for_ever(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert "a loop of symbolic links?" in refusal(f"sqlite:///{tmp_path}/loop/x.db")
