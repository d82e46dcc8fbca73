"""A sidecar imports only what its chosen store needs: another store's client library costs
tens to hundreds of milliseconds of start-up (redis-py alone ~0.1-0.2 s here) and some MiB of
memory, for nothing. Each check runs in a fresh interpreter and looks at ``sys.modules``."""

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
# What the configuration reads of every store: its description (and what that needs to check
# a URL or an option).
DESCRIPTION_MODULES = {"description", "target", "settings"}

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
