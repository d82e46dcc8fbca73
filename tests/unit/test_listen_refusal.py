"""A listener that cannot bind ends the start with one line naming the flag and the fix
(issue 32: a port in use gave exit 1 after four JSON log lines, none naming ``--listen``).
Exit status 1, not 2: a port in use may be free on the next start. Real processes."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_config import run_cli


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("flag", ["--listen", "--public-listen"])
def test_a_port_in_use_is_one_line_naming_the_flag_and_the_fix(
    flag: str, taken_port: int, tmp_path: Path
) -> None:
    ports = {"--listen": "127.0.0.1:0", "--public-listen": "127.0.0.1:0"}
    ports[flag] = f"127.0.0.1:{taken_port}"
    result = run_cli(
        "--store", f"sqlite:///{tmp_path}/l.db", *(x for kv in ports.items() for x in kv)
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    plain = [line for line in lines if not line.startswith("{")]
    assert plain == [
        f"leader-sidecar: {flag}=127.0.0.1:{taken_port}: the port is in use (another "
        "leader-sidecar on this host? each copy needs its own --listen and --public-listen "
        f"ports); stop that program or pick a free port with {flag}"
    ]
    assert lines[-1] == plain[0]  # the last word, after the logs of the stop
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    assert [entry["level"] for entry in logged if entry["level"] != "info"] == []
