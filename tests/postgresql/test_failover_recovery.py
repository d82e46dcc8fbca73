"""Recovery in one round trip on PostgreSQL, with real processes: the primary hangs (SIGSTOP:
its connections answer nothing until their timeout) and an up-to-date standby is promoted. The
leader's renewal that hung fails; the promoted standby answers well before the deadline, so the
leader renews there at once and keeps its term — no demotion at the deadline, no new term."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.postgresql.servers import PostgresServer
from tests.support.sidecars import LeaderObserver, SidecarProcess

pytestmark = pytest.mark.slow

LEASE = 2.0


async def caught_up(primary: PostgresServer, standby: PostgresServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    target = await asyncio.to_thread(primary.current_lsn)
    while time.monotonic() < deadline:
        replayed = await asyncio.to_thread(
            standby.value, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
        )
        if replayed == "t":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the standby never replayed the primary's newest write")


@pytest.mark.timeout(180)
async def test_a_leader_keeps_its_term_across_a_failover_to_a_promoted_standby() -> None:
    primary = await asyncio.to_thread(PostgresServer.start)
    standby: PostgresServer | None = None
    sidecars: list[SidecarProcess] = []
    try:
        standby = await asyncio.to_thread(primary.standby)
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        url = primary.url().replace(f"127.0.0.1:{primary.port}", hosts)
        for name in ("s0", "s1"):
            sidecars.append(
                await asyncio.to_thread(
                    SidecarProcess.start, name, url, lease_duration=f"{LEASE:g}s"
                )
            )
        async with LeaderObserver(sidecars) as observer:
            first = await observer.leader(timeout=20)
            await asyncio.sleep(LEASE)  # a few renewals
            await caught_up(primary, standby, timeout=10)
            await asyncio.to_thread(primary.pause)
            failed_over = time.time()
            await asyncio.to_thread(standby.promote)
            # Three leases on the promoted standby.
            await observer.wait_for(
                lambda s: s.leader and s.sent > failed_over + 3 * LEASE, timeout=30
            )
            reigns = {
                (s.identity, s.term) for s in observer.samples if s.leader and s.sent > failed_over
            }
            assert reigns == {(first.identity, first.term)}, (
                f"the leader's term changed across the failover: {sorted(reigns, key=str)}"
            )
            assert not observer.two_leaders_at_once()
    finally:
        for sidecar in sidecars:
            await asyncio.to_thread(sidecar.stop)
        primary.resume()
        if standby is not None:
            standby.destroy()
        primary.destroy()
