"""Each subcommand has its own usage, options and exit statuses: ``leader-sidecar status
--help`` describes status (its ``-o``, the store flags it reads), not the server; ``transfer
--help`` describes transfer instead of failing; a bad argument is one line and exit 2. The
server's own flags are unchanged, and its help names the subcommands. Real processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.backends.sqlite import SQLiteStoreClient
from sidecar.config import OPTIONS
from tests.unit.test_config import run_cli

SERVER_ONLY = ("--listen", "--public-listen", "--webhook-url", "--identity", "--signal")


def flat(text: str) -> str:
    """The help text with argparse's line wrapping undone."""
    return " ".join(text.split())


def test_status_help_is_its_own() -> None:
    result = run_cli("status", "--help")
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert out.startswith("usage: leader-sidecar status ")
    assert "-o {table,json}, --output {table,json}" in out
    for flag in ("--store URL", "--lease NAME", "--shards N", "--group NAME", "--namespace NS"):
        assert flag in out
    assert "[env LEADER_SIDECAR_STORE]" in out
    assert "exit status: 0 printed, 1 the store did not answer or is not there, 2 bad" in out
    for flag in SERVER_ONLY:
        assert f"{flag} " not in out, flag


def test_transfer_help_is_its_own() -> None:
    result = run_cli("transfer", "--help")
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert out.startswith("usage: leader-sidecar transfer [-h] [--to ID|any] [--lease NAME]")
    assert "--url URL" in out
    assert "(default http://127.0.0.1:4040)" in out
    assert "exit status: 0 handed over, 1 refused" in out
    assert "--store" not in out


def test_postgresql_schema_help_is_its_own() -> None:
    result = run_cli("postgresql-schema", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: leader-sidecar postgresql-schema ")


def test_the_server_help_keeps_every_flag_and_names_the_subcommands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert out.startswith("usage: leader-sidecar [-h] ")
    for option in OPTIONS:
        assert f"{option.flag} {option.metavar}" in out, option.flag
        assert f"[env {option.env}]" in out, option.env
    for command in ("status", "transfer", "postgresql-schema"):
        assert f"leader-sidecar {command} " in out
    assert "exit status: 0 after SIGTERM/SIGINT" in out


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["status", "-o", "yaml"], "argument -o/--output: invalid choice: 'yaml'"),
        (["status", "--listen", "127.0.0.1:0"], "unrecognized arguments: --listen"),
        (["status", "--lease-duration", "soon"], "--lease-duration=soon: "),
        (["transfer", "--help-me"], "unrecognized arguments: --help-me"),
        (["transfer", "--to"], "argument --to: expected one argument"),
    ],
    ids=["bad output", "server-only flag", "bad duration", "unknown flag", "missing value"],
)
def test_a_bad_argument_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], wanted: str
) -> None:
    result = run_cli(*args, env={"LEADER_SIDECAR_STORE": f"sqlite:///{tmp_path}/l.db"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"leader-sidecar {args[0]}: "), lines[0]
    assert wanted in lines[0]
    assert result.stdout == ""


def test_status_reads_its_store_and_leases_from_the_flags(tmp_path: Path) -> None:
    """The flags reach the store: a store no lease was taken in, two shards, nobody holding
    them."""
    db = tmp_path / "leases.db"

    async def used() -> None:  # (status creates no store: issue 32)
        client = SQLiteStoreClient(str(db))
        await client.candidates("jobs").list()
        await client.close()

    asyncio.run(used())
    store = f"sqlite:///{db}"
    result = run_cli("status", "--store", store, "--lease", "jobs", "--shards", "2", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert '"lease": "jobs-1"' in result.stdout
    assert '"state": "none"' in result.stdout
