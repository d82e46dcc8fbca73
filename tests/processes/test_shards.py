"""Several leases per sidecar with real processes on one SQLite file: the shards spread over
the replicas, a SIGKILLed replica's shards are taken, `leader-sidecar status` reads it all
from the store, and `leader-sidecar transfer` moves a lease on purpose."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.sidecars import SidecarProcess, sidecars

pytestmark = pytest.mark.slow

SHARDS = ["--lease", "jobs", "--shards", "6"]
NAMES = [f"jobs-{i}" for i in range(6)]


async def leases(session: aiohttp.ClientSession, proc: SidecarProcess) -> dict[str, Any]:
    async with session.get(f"http://{proc.local}/leases") as response:
        assert response.status == 200
        return await response.json()


async def held(session: aiohttp.ClientSession, procs: list[SidecarProcess]) -> dict[str, list]:
    answers = {}
    for proc in procs:
        body = await leases(session, proc)
        answers[proc.name] = sorted(e["lease"] for e in body["leases"] if e["leader"])
    return answers


async def until(session, procs, condition, timeout: float) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    while True:
        now = await held(session, procs)
        if condition(now):
            return now
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.05)


def cli(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "LEADER_SIDECAR_STORE": store},
    )


async def test_shards_spread_survive_a_crash_and_move_on_purpose(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a", "b", "c"], store, args=SHARDS) as procs:
        async with aiohttp.ClientSession() as session:
            spread = await until(
                session, procs, lambda h: sorted(map(len, h.values())) == [2, 2, 2], 10
            )
            every = sorted(lease for names in spread.values() for lease in names)
            assert every == NAMES  # each shard led by exactly one replica
            # Ready a lease later too, although a replica at its share may send no request
            # for the first lease at all (its candidate record still answers).
            await asyncio.sleep(1.5)
            for proc in procs:
                async with session.get(f"http://{proc.public}/readyz") as response:
                    assert response.status == 200, (proc.name, await response.text())

            status = cli("status", *SHARDS, "-o", "json", store=store)
            assert status.returncode == 0, status.stderr
            table = json.loads(status.stdout)
            holders = {row["lease"]: row["holder"] for row in table["leases"]}
            identities = {p.name: p.identity for p in procs}
            for name, names in spread.items():
                for lease in names:
                    assert holders[lease] == identities[name]
            assert {c["identity"] for c in table["candidates"]} == set(identities.values())
            assert all(c["holds"] == 2 for c in table["candidates"])
            text = cli("status", *SHARDS, store=store)
            assert text.returncode == 0
            assert "jobs-5" in text.stdout
            assert "CANDIDATE" in text.stdout

            # A transfer from the shell: one of a's shards to b, by pod name.
            lease = spread["a"][0]
            moved = cli(
                "transfer",
                "--url",
                f"http://{procs[0].local}",
                "--to",
                "b",
                "--lease",
                lease,
                store=store,
            )
            assert moved.returncode == 0, moved.stderr
            assert json.loads(moved.stdout) == {
                "transferred": [lease],
                "successor": identities["b"],
            }
            await until(session, procs, lambda h: lease in h["b"], 2)
            refused = cli(
                "transfer", "--url", f"http://{procs[0].local}", "--to", "zed", store=store
            )
            assert refused.returncode == 1
            assert "not a live candidate" in refused.stderr

            # SIGKILL c: its shards are taken by a and b, 3 each, within about a lease.
            procs[2].kill()
            started = time.monotonic()
            after = await until(
                session, procs[:2], lambda h: sorted(map(len, h.values())) == [3, 3], 10
            )
            assert time.monotonic() - started < 6
            assert sorted(x for names in after.values() for x in names) == NAMES
