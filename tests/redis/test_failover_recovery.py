"""A Redis master that hangs (SIGSTOP: its connections answer nothing) while Sentinel promotes
its replica, with real processes: the sidecars follow Sentinel to the new master, and with a
lease that outlasts the failover (Sentinel: down after 1 s, ~2.3 s in all here) the leader keeps
its term, never two leaders at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.redis.servers import sentinel_group
from tests.support.sidecars import LeaderObserver, SidecarProcess

pytestmark = pytest.mark.slow

LEASE = 6.0


@pytest.mark.timeout(180)
async def test_a_hung_master_replaced_by_sentinel_keeps_the_leaders_term() -> None:
    with sentinel_group(replicas=1) as group:
        sidecars: list[SidecarProcess] = []
        try:
            for name in ("s0", "s1"):
                sidecars.append(
                    await asyncio.to_thread(
                        SidecarProcess.start, name, group.url(), lease_duration=f"{LEASE:g}s"
                    )
                )
            async with LeaderObserver(sidecars) as observer:
                first = await observer.leader(timeout=20)
                await asyncio.sleep(1.0)  # the replica has the grant
                old = group.master()
                await asyncio.to_thread(old.pause)
                hung = time.time()
                try:
                    await asyncio.to_thread(group.wait_master_is_not, old, 20.0)
                    await observer.wait_for(
                        lambda s: s.leader and s.sent > hung + 2 * LEASE, timeout=30
                    )
                finally:
                    await asyncio.to_thread(old.resume)
                reigns = {
                    (s.identity, s.term) for s in observer.samples if s.leader and s.sent > hung
                }
                assert not observer.two_leaders_at_once()
                assert reigns == {(first.identity, first.term)}, sorted(reigns, key=str)
        finally:
            for sidecar in sidecars:
                await asyncio.to_thread(sidecar.stop)
