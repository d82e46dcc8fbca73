"""A sidecar imports only what its chosen store needs: another store's client library costs
tens to hundreds of milliseconds of start-up (redis-py alone ~0.1-0.2 s here) and some MiB of
memory, for nothing. And the first answer comes before what only the leases at work need (the
electors, the API at work). Each check runs in a fresh interpreter and looks at ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tools import REPO
from tests.unit.test_config import KUBECONFIG

# Each store's own third-party client library (the others' must not be imported).
LIBRARIES = {
    "sqlite": set(),
    "redis": {"redis"},
    "postgresql": {"asyncpg"},
    "etcd": set(),
    "kubernetes": {"yaml"},
    "zookeeper": set(),
}
# What the configuration reads of every store: its description (the chosen store's target
# too, to check its URL and options).
DESCRIPTION_MODULES = {"description", "names"}  # (PostgreSQL's names: its schemes, its extra)
# Ours that the first answer does not need: the API at work, the electors and the lease set
# come with the store's client, after the listeners answer.
NOT_BEFORE_FIRST_ANSWER = {
    "sidecar.api",
    "sidecar.backends.actions",
    "sidecar.backends.base",
    "sidecar.changes",
    "sidecar.elector",
    "sidecar.lease_set",
    "sidecar.observed",
}

_PROBE = """
import asyncio, json, sys
from sidecar.app import Sidecar
from sidecar.config import load

async def main() -> None:
    sidecar = Sidecar(load(sys.argv[1:], environ={}))
    sidecar.open()
    if START:
        await sidecar.start()
        await sidecar.stop()

asyncio.run(main())
print(json.dumps(sorted(sys.modules)))
"""


def loaded_modules(args: list[str], cwd: Path, start: bool = False) -> set[str]:
    code = _PROBE.replace("START", str(start))
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=60, cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


def store_args(store: str, tmp_path: Path) -> list[str]:
    urls = {
        "sqlite": f"sqlite:///{tmp_path / 'leases.db'}",
        "redis": "redis://127.0.0.1:1/0",
        "postgresql": "postgresql://sidecar@127.0.0.1:1/app",
        "etcd": "etcd://127.0.0.1:1/app",
        "zookeeper": "zookeeper://127.0.0.1:1/app",
    }
    if store == "kubernetes":
        (tmp_path / "kubeconfig").write_text(KUBECONFIG)
        return ["--store", "kubernetes", "--kubeconfig", str(tmp_path / "kubeconfig"),
                "--lease", "app"]  # fmt: skip
    return ["--store", urls[store], "--lease", "app"]


def foreign(modules: set[str], store: str) -> list[str]:
    """What ``modules`` hold that only another store needs."""
    found = []
    for other, libraries in LIBRARIES.items():
        if other == store:
            continue
        found += [m for m in modules if m.split(".")[0] in libraries - LIBRARIES[store]]
        prefix = f"sidecar.backends.{other}."
        found += [
            m for m in modules
            if m.startswith(prefix) and m[len(prefix):] not in DESCRIPTION_MODULES
        ]  # fmt: skip
    return sorted(set(found))


@pytest.mark.parametrize("store", sorted(LIBRARIES))
def test_a_sidecar_imports_no_other_stores_client(store: str, tmp_path: Path) -> None:
    """Built for one store (its client open, every lease's elector made), a sidecar holds no
    other store's client library nor any other store's modules beyond its description."""
    modules = loaded_modules(store_args(store, tmp_path), tmp_path)
    assert foreign(modules, store) == []
    assert f"sidecar.backends.{store}.description" in modules


def test_a_sqlite_sidecar_started_and_stopped_imports_no_network_store_client(
    tmp_path: Path,
) -> None:
    """The embedded store through a whole start (listeners, the store's thread, the first
    attempt) and stop: no redis-py, asyncpg or YAML, and no other store's client modules."""
    args = [*store_args("sqlite", tmp_path), "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0"]  # fmt: skip
    modules = loaded_modules(args, tmp_path, start=True)
    assert foreign(modules, "sqlite") == []
    assert {"redis", "asyncpg", "yaml"} & {m.split(".")[0] for m in modules} == set()
    assert "sidecar.backends.sqlite.client" in modules


# Through the command line's own path: the moment the store is about to be opened, the
# listeners answer; one ``GET /leader`` there, then what is imported, and out.
_FIRST_ANSWER_PROBE = """
import json, os, socket, sys
from sidecar import app, cli

def at_first_answer(self):
    where = self.addresses["local"]
    with socket.create_connection((where.host, where.port), timeout=10) as sock:
        sock.sendall(b"GET /leader HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\\r\\n\\r\\n")
    print(json.dumps({"status": head.split(b" ")[1].decode(), "body": json.loads(body),
                      "modules": sorted(sys.modules)}), flush=True)
    os._exit(0)

app.Sidecar.open = at_first_answer
cli.main(sys.argv[1:])
"""


@pytest.mark.parametrize("store", sorted(LIBRARIES))
def test_the_first_answer_comes_before_the_elector_and_the_api_at_work_are_imported(
    store: str, tmp_path: Path
) -> None:
    """``leader-sidecar`` answers its first ``GET /leader`` (503, starting) before it imports
    the electors, the lease set and the API at work (they come with the store's client), and
    with no other store's modules beyond its description: a start spends its CPU before the
    first answer on what that answer needs."""
    args = [*store_args(store, tmp_path), "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0", "--log-level", "warning"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", _FIRST_ANSWER_PROBE, *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.splitlines()[-1])
    assert (seen["status"], seen["body"]["starting"]) == ("503", True)
    modules = set(seen["modules"])
    assert sorted(NOT_BEFORE_FIRST_ANSWER & modules) == [], "imported before the first answer"
    assert foreign(modules, store) == [], "another store's modules before the first answer"
