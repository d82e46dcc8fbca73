"""Real sidecars on a real PostgreSQL: a hand-off on SIGTERM within milliseconds (LISTEN), a
failover about one lease after a SIGKILL, `leader-sidecar status`, and the server itself
paused or restarted under them."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from tests.postgresql.conftest import Database
from tests.support.sidecars import observing, sidecars, signal_leader
from tests.support.tools import REPO

pytestmark = pytest.mark.slow


async def test_sigterm_of_the_leader_hands_off_within_moments(database: Database) -> None:
    """The hand-over is one statement; the successor hears it by NOTIFY and leads on it."""
    with sidecars(["a", "b", "c"], database.url) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.seconds < 0.5
            assert handover.leader.wait_exit(2.0) == 0
    observer.assert_never_two_leaders()


async def test_sigkill_of_the_leader_fails_over_about_one_lease_later(database: Database) -> None:
    with sidecars(["a", "b", "c"], database.url) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGKILL, within=5)
            assert 0.5 < handover.seconds < 2.5  # lease 1 s: observed expiry, then a grant
            assert (handover.successor.term or 0) > (handover.before.term or 0)
    observer.assert_never_two_leaders()


async def test_status_reads_the_holder_and_the_candidates_from_postgresql(
    database: Database,
) -> None:
    with sidecars(["a", "b"], database.url) as procs:
        async with observing(procs) as observer:
            leader = await observer.leader()
            await asyncio.sleep(0.8)  # both replicas have beaten once
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sidecar", "status", "--store", database.url, "-o", "json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    (lease,) = status["leases"]
    assert (lease["holder"], lease["term"], lease["state"]) == (
        leader.identity,
        leader.term,
        "held",
    )
    assert {c["identity"] for c in status["candidates"]} == {p.identity for p in procs}
    assert database.server.password not in done.stdout + done.stderr
    assert status["store"].startswith("postgresql://postgres@127.0.0.1:")


@pytest.mark.timeout(120)
async def test_a_paused_then_restarted_server_keeps_one_leader() -> None:
    """SIGSTOP of the whole server demotes the leader at its deadline (fail closed); a
    restart (data kept) breaks every session: the watch reconnects, a leader is back, and
    there were never two."""
    from tests.postgresql.servers import PostgresServer

    server = await asyncio.to_thread(PostgresServer.start)
    try:
        with sidecars(["a", "b", "c"], server.url()) as procs:
            async with observing(procs) as observer:
                first = await observer.leader(timeout=20)
                server.pause()
                paused = time.time()
                try:
                    await observer.wait_for(
                        lambda s: s.name == first.name and not s.leader and s.sent > paused,
                        timeout=3,
                    )
                finally:
                    server.resume()
                await observer.leader(timeout=10, after=time.time())
                await asyncio.to_thread(server.restart, signal.SIGKILL)
                restarted = time.time()
                back = await observer.leader(timeout=15, after=restarted)
                assert (back.term or 0) >= (first.term or 0)
    finally:
        server.destroy()
