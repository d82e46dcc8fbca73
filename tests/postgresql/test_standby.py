"""Store loss on PostgreSQL (rules 5 and 8), with real processes: a streaming standby
(``pg_basebackup -R``, asynchronous) that missed the newest grant is promoted after the primary
crashes. The sidecars' URL names both hosts; they find the promoted standby, which shows an
older grant than they saw."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.chaos.faults import release
from tests.chaos.proxy import TcpProxy
from tests.postgresql.servers import PostgresServer
from tests.support.sidecars import LeaderObserver, SidecarProcess

pytestmark = pytest.mark.slow


def terms_served_by_two(observer: LeaderObserver) -> dict[int, set[str]]:
    served: dict[int, set[str]] = {}
    for sample in observer.samples:
        if sample.leader and sample.term is not None and sample.identity:
            served.setdefault(sample.term, set()).add(sample.identity)
    return {term: ids for term, ids in served.items() if len(ids) > 1}


@pytest.mark.timeout(180)
async def test_a_promoted_standby_that_missed_the_newest_grant_never_makes_two_leaders() -> None:
    """The holder of the forgotten grant puts it back (its term and all); the others see a loss
    and wait it out; never two leaders at once, no term served by two identities."""
    primary = await asyncio.to_thread(PostgresServer.start)
    standby: PostgresServer | None = None
    sidecars: list[SidecarProcess] = []
    # The standby streams through a proxy: cut (reset) it, and what the primary sent after the
    # cut never arrives, even bytes already on their way.
    link = await TcpProxy("127.0.0.1", primary.port, "replication").start()
    try:
        standby = await asyncio.to_thread(primary.standby, via_port=link.port)
        hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        url = primary.url().replace(f"127.0.0.1:{primary.port}", hosts)
        for i in range(3):
            sidecars.append(
                await asyncio.to_thread(
                    SidecarProcess.start,
                    f"s{i}",
                    url,
                    lease_duration="1s",
                    args=["--log-level", "info"],
                )
            )
        async with LeaderObserver(sidecars) as observer:
            first = await observer.leader(timeout=20)
            assert first.term is not None
            await asyncio.sleep(0.5)  # the standby has the grant and a few renewals
            link.set_mode("reset")  # from here on the standby misses every write
            holder = next(s for s in sidecars if s.name == first.name)
            await release(holder)
            newest = await observer.wait_for(
                lambda s: s.leader and (s.term or 0) > (first.term or 0), timeout=10
            )
            await asyncio.sleep(0.5)  # renewals the standby misses too
            await asyncio.to_thread(primary.stop, signal.SIGKILL)
            # Read while it is still a standby (read-only): once promoted, the sidecars write
            # over what it shows at once (a loss marker, or the newest holder's grant put back).
            assert standby.value(
                "SELECT term FROM leader_sidecar.leases WHERE name = 'default'"
            ) == str(first.term), "the standby did not miss the newest grant"
            await asyncio.to_thread(standby.promote)
            promoted = time.time()
            after = await observer.wait_for(
                lambda s: s.leader and s.sent > promoted + 0.5, timeout=20
            )
            await asyncio.sleep(3.0)  # a few leases on the promoted standby
            assert not observer.two_leaders_at_once()
            assert not terms_served_by_two(observer)
            assert (after.term or 0) >= (newest.term or 0)
            assert int(standby.value("SELECT term FROM leader_sidecar.grants")) >= (
                newest.term or 0
            )
    finally:
        for sidecar in sidecars:
            await asyncio.to_thread(sidecar.stop)
        await link.stop()
        if standby is not None:
            standby.destroy()
        primary.destroy()
