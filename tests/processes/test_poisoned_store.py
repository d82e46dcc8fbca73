"""Issue 25's rows replayed as a user would: real sidecars on one SQLite file, edited by hand
with the sqlite3 module while they run. Whatever the file holds, every lease is led again
within a couple of leases, no background task dies, the probes stay green, and a record
written once (a ghost candidate) is never handed a lease."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.sidecars import SidecarProcess, sidecars

pytestmark = pytest.mark.slow

LEASES = ["--lease", "a,b,c"]
LEASE = 2.0


def hand_edit(db: Path, statement: str, *params: object) -> None:
    conn = sqlite3.connect(db, timeout=5)
    try:
        conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


def ghost(db: Path, identity: object, priority: object = 0, started_at: object = None) -> None:
    hand_edit(
        db,
        'INSERT INTO candidates ("group", identity, revision, priority, leaving, started_at, '
        "beat_at, version) VALUES ('a', ?, '', ?, 0, ?, ?, abs(random()))",
        identity,
        priority,
        started_at,
        # Now, by the wall clock: older rows are garbage the next beat collects.
        datetime.now(UTC).isoformat(timespec="microseconds"),
    )


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def leaders(session: aiohttp.ClientSession, procs: list[SidecarProcess]) -> dict[str, Any]:
    """lease → (sidecar name, term) of whoever says it leads it now."""
    found: dict[str, Any] = {}
    for proc in procs:
        status, body = await get(session, f"http://{proc.local}/leases")
        assert status == 200, (proc.name, body)
        for entry in body["leases"]:
            if entry["leader"]:
                found[entry["lease"]] = (proc.name, entry["term"])
    return found


async def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.05)


def metric(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a /metrics page."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


async def assert_healthy(session: aiohttp.ClientSession, procs: list[SidecarProcess]) -> None:
    """Every probe green, no task ever failed, /leases answers on both listeners."""
    for proc in procs:
        for path in ("/healthz", "/readyz"):
            status, body = await get(session, f"http://{proc.public}{path}")
            assert status == 200, (proc.name, path, body)
        for listener in (proc.local, proc.public):
            status, body = await get(session, f"http://{listener}/leases")
            assert status == 200, (proc.name, body)
        _, page = await get(session, f"http://{proc.public}/metrics")
        assert metric(page, "leader_sidecar_task_failures_total") == 0, proc.name
        assert not [e for e in proc.logs if "never retrieved" in str(e.get("msg"))]
        assert not [line for line in proc.raw if "Traceback" in line], proc.name


def cli(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "LEADER_SIDECAR_STORE": store},
    )


async def test_poisoned_candidate_rows_and_a_ghost_leave_the_leases_balanced_and_led(
    tmp_path: Path,
) -> None:
    """Rows 1 and 7: a candidate row with ``priority='abc'``, one with a BLOB identity, one
    with ``started_at='not-a-date'``, and a ghost with the highest priority written once. The
    heartbeats live, the leases spread 1/1/1, ``status`` prints the rows flagged, and a
    transfer or a shutdown hands the lease to a replica that runs."""
    db = tmp_path / "leases.db"
    store = f"sqlite:///{db}"
    with sidecars(["a"], store, args=LEASES, lease_duration=f"{LEASE}s") as first:
        async with aiohttp.ClientSession() as session:
            await until(lambda: _count(session, first, 3), 10, "a alone leads the three leases")
            ghost(db, b"\xff\x00")
            ghost(db, "ghost-priority", priority="abc")
            ghost(db, "ghost-started", started_at="not-a-date")
            ghost(db, "ghost-boss", priority=999_999_999)
            with sidecars(["b", "c"], store, args=LEASES, lease_duration=f"{LEASE}s") as more:
                procs = [*first, *more]

                async def spread() -> bool:
                    now = await leaders(session, procs)
                    owners = sorted(name for name, _ in now.values())
                    return len(now) == 3 and owners == ["a", "b", "c"]

                await until(spread, 20, "the balancer spreads the leases 1/1/1")
                await assert_healthy(session, procs)
                identities = {p.identity for p in procs}
                for proc in procs:
                    _, page = await get(session, f"http://{proc.public}/metrics")
                    bad = 'leader_sidecar_bad_records_total{kind="candidate"}'
                    assert metric(page, bad) >= 3, proc.name
                    _, body = await get(session, f"http://{proc.local}/leases")
                    assert {c["identity"] for c in body["candidates"]} <= identities | {
                        "ghost-started",
                        "ghost-boss",
                    }

                status = cli("status", *LEASES, store=store)
                assert status.returncode == 0, status.stderr
                assert "Traceback" not in status.stderr
                assert "unreadable" in status.stdout
                assert "\\xff" in status.stdout  # the BLOB identity, escaped

                now = await leaders(session, procs)
                holder_of_a = next(p for p in procs if p.name == now["a"][0])
                moved = cli(
                    "transfer", "--url", f"http://{holder_of_a.local}", "--to", "any",
                    "--lease", "a", store=store,
                )  # fmt: skip
                assert moved.returncode == 0, moved.stderr
                assert json.loads(moved.stdout)["successor"] in identities

                async def a_led_by_another() -> Any:
                    led = (await leaders(session, procs)).get("a")
                    return led if led and led[0] != holder_of_a.name else None

                await until(a_led_by_another, 3, "the transfer lands on a running replica")
                # (The balancer may move a lease back meanwhile: wait until all are led.)
                now = await until(lambda: _all_led(session, procs), 3 * LEASE, "all led")
                leaving = next(p for p in procs if p.name == now["b"][0])
                leaving.signal(signal.SIGTERM)
                assert leaving.wait_exit(5) == 0
                rest = [p for p in procs if p is not leaving]

                async def b_handed_over() -> Any:
                    return (await leaders(session, rest)).get("b")

                # Handed over in one write to a running replica: far sooner than a lease.
                await until(b_handed_over, LEASE / 2, "the shutdown hands b to a replica")
                await assert_healthy(session, rest)


async def _count(session: aiohttp.ClientSession, procs: list[SidecarProcess], n: int) -> bool:
    return len(await leaders(session, procs)) == n


async def test_a_poisoned_lease_row_is_waited_out_and_every_lease_is_led_again(
    tmp_path: Path,
) -> None:
    """Rows 2 and 3: ``term = 9223372036854775807`` on one lease, ``renewed_at = 'garbage'`` on
    another. The second stays with its leader; the first is waited out and led again with a
    term the file can hold — also after the row is mended by hand — by sidecars that never
    remember 2^63 as a term they saw."""
    db = tmp_path / "leases.db"
    store = f"sqlite:///{db}"
    with sidecars(["a", "b", "c"], store, args=LEASES, lease_duration=f"{LEASE}s") as procs:
        async with aiohttp.ClientSession() as session:
            before = await until(lambda: _all_led(session, procs), 15, "every lease led")
            hand_edit(db, "UPDATE leases SET renewed_at = 'garbage' WHERE name = 'c'")
            hand_edit(db, "UPDATE leases SET term = 9223372036854775807 WHERE name = 'b'")
            poisoned = time.monotonic()

            async def b_led_again() -> Any:
                now = await leaders(session, procs)
                return now if len(now) == 3 and now["b"][1] != before["b"][1] else None

            after = await until(b_led_again, 4 * LEASE, "b led again")
            assert time.monotonic() - poisoned >= LEASE * 0.9  # waited out, not taken at once
            assert after["b"][1] < 2**53
            assert after["c"] == before["c"]  # a timestamp is not a fail-over

            # Poisoned and mended again by hand before anyone took it over.
            term = after["b"][1]
            hand_edit(db, "UPDATE leases SET term = 9223372036854775807 WHERE name = 'b'")
            await asyncio.sleep(0.3)
            hand_edit(db, "UPDATE leases SET term = ? WHERE name = 'b'", term)

            async def led_sanely() -> Any:
                now = await leaders(session, procs)
                return now if len(now) == 3 else None

            await asyncio.sleep(2 * LEASE)
            final = await until(led_sanely, 4 * LEASE, "every lease led after the mend")
            assert all(t < 2**53 for _, t in final.values())
            for proc in procs:
                _, body = await get(session, f"http://{proc.local}/leases")
                assert all(entry["term"] < 2**53 for entry in body["leases"]), body
            await assert_healthy(session, procs)
            lines = [e for p in procs for e in p.logs if e.get("logger") == "sidecar.records"]
            assert lines, "nobody reported the poisoned row"


async def _all_led(session: aiohttp.ClientSession, procs: list[SidecarProcess]) -> Any:
    now = await leaders(session, procs)
    return now if len(now) == 3 else None
