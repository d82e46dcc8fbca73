"""Issue 9's store-side failure classes, one deterministic test each, with real processes:
three sidecars, a real store, and an observer polling every ``/leader`` every 10 ms.

* case 1 — the SQLite lease row deleted twice in a row, the second time while the leader
  granted after the first is inside its deadline: every loss is waited out on its own;
* case 4 — the Redis host's wall clock steps forward an hour (an NTP step, a VM resume): the
  key's TTL follows that clock, but expiry is observed, so nobody takes the lease — also a
  replica that starts while the key is gone and the leader is paused for a moment;
* case 7 — the store loses everything just as the leader dies, and a replacement starts
  while the survivor waits the loss out (the sharded chaos run of seed 1134721443): the
  survivor writes the loss down, so the replacement waits too instead of counting from 1;
* case 5 — one sidecar in its own time namespace (``unshare --time``): its CLOCK_BOOTTIME is
  a day ahead of the others', which must not make a live lease look expired.

Cases 2, 3 and 6 are decided by the elector alone and are tested on a hand-moved clock in
``tests/unit/test_elector.py`` (``test_case2_…``, ``test_case3_…``, ``test_case6_…``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.backends.base import LOST_HOLDER
from tests.chaos.clock import ClockShift, build_shim
from tests.chaos.stores import ShiftedRedisServer
from tests.support.sidecars import LeaderObserver, SidecarProcess, observing, sidecars

pytestmark = pytest.mark.slow

LEASE = 1.0


async def hold_steady(observer: LeaderObserver, seconds: float) -> None:
    """Watch for ``seconds`` and fail at once if two replicas ever led together."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        observer.assert_never_two_leaders()


def terms_served(observer: LeaderObserver) -> dict[int, set[str]]:
    served: dict[int, set[str]] = {}
    for sample in observer.samples:
        if sample.leader and sample.term is not None and sample.identity:
            served.setdefault(sample.term, set()).add(sample.identity)
    return served


def assert_terms_unique(observer: LeaderObserver) -> None:
    shared = {term: who for term, who in terms_served(observer).items() if len(who) > 1}
    assert not shared, f"terms served by two identities: {shared}"


# -- case 1: two losses in a row (SQLite) -------------------------------------------------------


async def test_case1_a_second_deletion_is_waited_out_too(tmp_path: Path) -> None:
    """Delete the row, wait for the next grant, delete it again at once: the replica granted
    after the first loss still leads until its deadline, so nobody may be granted for a
    lease after the second. Never two leaders; every term served by one identity."""
    database = tmp_path / "leases.db"
    with sidecars(["a", "b", "c"], f"sqlite:///{database}") as procs:
        async with observing(procs) as observer:
            leader = await observer.leader(timeout=10)
            # Every replica has seen the grant: a candidate that has seen nothing cannot tell a
            # store that lost everything from a new one (the README's first limit).
            for proc in procs:
                await observer.wait_for(
                    lambda s, n=proc.name: (
                        s.name == n and s.body is not None and s.body["holder"] == leader.identity
                    ),
                    timeout=10,
                )
            for _loss in range(2):
                delete_rows(database)
                deleted = time.time()
                # Someone leads a lease later: the holder that put its grant back, or (if it
                # could not) the replica granted after waiting out the loss. Delete again at
                # once: that leader is inside its deadline now.
                await observer.leader(timeout=10, after=deleted + LEASE + 0.2)
                observer.assert_never_two_leaders()
            await hold_steady(observer, 3 * LEASE)
            assert_terms_unique(observer)


def delete_rows(database: Path) -> None:
    with contextlib.closing(sqlite3.connect(database, timeout=5)) as conn:
        conn.execute("DELETE FROM leases")
        conn.commit()


# -- case 7: a replica that starts during the wait (SQLite) -------------------------------------


async def test_case7_a_replica_started_after_a_loss_others_saw_does_not_count_from_1(
    tmp_path: Path,
) -> None:
    """The leader dies and the store loses its row in the same moment; a replacement starts
    before the survivor's wait is over. The store shows it nothing — but the survivor saw the
    loss and wrote it down (a loss marker with the term it saw), so the replacement waits the
    loss out as well and no term is granted twice. Before loss markers it took term 1 at once
    and served it a second time."""
    database = tmp_path / "leases.db"
    store = f"sqlite:///{database}"
    lease = 4.0  # the replacement must start and look within the survivor's wait
    with sidecars(["a", "b"], store, lease_duration=f"{lease}s") as procs:
        async with observing(procs) as observer:
            leader = await observer.leader(timeout=10)
            survivor = next(p for p in procs if p.identity != leader.identity)
            await observer.wait_for(
                lambda s: s.name == survivor.name and s.term == leader.term, timeout=10
            )
            next(p for p in procs if p.identity == leader.identity).kill()
            delete_rows(database)
            await _until_marked(database, timeout=2.0)  # (before markers: never; go on anyway)
            newcomer = SidecarProcess.start("c", store, lease_duration=f"{lease}s")
            try:
                observer.watch(newcomer)
                after = await observer.leader(timeout=4 * lease, after=time.time())
                await hold_steady(observer, lease)
                assert_terms_unique(observer)
                assert after.term is not None
                assert leader.term is not None
                assert after.term > leader.term
            finally:
                newcomer.stop()


async def _until_marked(database: Path, timeout: float) -> None:
    """Until the lease table holds a loss marker, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(database, timeout=5)) as conn:
            if conn.execute("SELECT 1 FROM leases WHERE holder = ?", (LOST_HOLDER,)).fetchone():
                return
        await asyncio.sleep(0.01)


# -- case 4: the Redis host's clock steps -------------------------------------------------------


@pytest.fixture
def stepped_redis(tmp_path: Path) -> Iterator[tuple[ShiftedRedisServer, ClockShift]]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the clock-step shim")
    shim = build_shim(tmp_path)
    clock = ClockShift(shim, tmp_path / "redis-clock")
    server_class = type("RedisWithClock", (ShiftedRedisServer,), {"ENV": clock.env})
    directory = tmp_path / "redis"
    directory.mkdir()
    server = server_class.start(directory)
    try:
        yield server, clock  # type: ignore[misc]
    finally:
        server.stop()


@pytest.mark.parametrize("step", [3600.0, -3600.0])
async def test_case4_a_redis_clock_step_moves_no_lease(
    stepped_redis: tuple[ShiftedRedisServer, ClockShift], step: float
) -> None:
    """Forward: the key's TTL runs out at once on the server, yet nobody is granted — the
    followers keep seeing the leader's renewals, and the leader puts its key back. Back: the
    key would outlive a dead leader by an hour; followers take over a lease after it dies."""
    server, clock = stepped_redis
    with sidecars(["a", "b", "c"], server.url) as procs:
        async with observing(procs) as observer:
            leader = await observer.leader(timeout=10)
            if step > 0:
                clock.step(step)
                await hold_steady(observer, 3 * LEASE)
                now = await observer.leader(timeout=5, after=time.time())
                assert (now.identity, now.term) == (leader.identity, leader.term), (
                    "the clock step moved the lease"
                )
            else:
                dead = next(p for p in procs if p.identity == leader.identity)
                dead.kill()
                killed = time.monotonic()
                clock.step(step)  # the dead leader's key now lives an hour longer
                successor = await observer.leader(timeout=5 * LEASE + 5, after=time.time())
                assert successor.identity != leader.identity
                assert time.monotonic() - killed < 2 * LEASE + 2, "stuck behind the key's TTL"
            assert_terms_unique(observer)
            observer.assert_never_two_leaders()


async def test_case4_a_key_the_clock_step_removed_is_not_free_to_a_new_replica(
    stepped_redis: tuple[ShiftedRedisServer, ClockShift],
) -> None:
    """The step removes the key while the leader is briefly paused (a GC pause, a slow node),
    and a replica that starts now finds only the term counter. That is no release: it must
    wait the leader out, not take the lease while the leader is inside its deadline."""
    server, clock = stepped_redis
    # The leader stays paused while the newcomer starts: a lease long enough that a slow
    # start on a busy machine does not outlast it (the leader would rightly lose the lease).
    lease = 3.0
    with sidecars(["a", "b"], server.url, lease_duration=f"{lease}s") as procs:
        async with observing(procs) as observer:
            leader = await observer.leader(timeout=10)
            paused = next(p for p in procs if p.identity == leader.identity)
            paused.pause()
            try:
                clock.step(3600.0)  # the leader's key is past its TTL on the server now
                newcomer = SidecarProcess.start("c", server.url, lease_duration=f"{lease}s")
                # Keep the leader paused until the newcomer has looked at the store (its answer
                # shows the term it found), so that its first decision meets the missing key,
                # not a key the resumed leader's renewal already put back.
                await _until_it_has_seen(newcomer, leader.term or 0, timeout=5.0)
            finally:
                paused.resume()
            try:
                observer.watch(newcomer)
                await hold_steady(observer, 2 * lease)
                assert_terms_unique(observer)
                now = await observer.leader(timeout=5, after=time.time())
                assert (now.identity, now.term) == (leader.identity, leader.term)
            finally:
                newcomer.stop()


async def _until_it_has_seen(sidecar: SidecarProcess, term: int, timeout: float) -> None:
    """Until ``sidecar``'s ``/leader`` reports a term of at least ``term`` (it has read the
    store), or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(sidecar.leader_url) as response:
                    if (await response.json()).get("term", 0) >= term:
                        return
            await asyncio.sleep(0.01)


# -- case 5: a sidecar in its own time namespace (SQLite) ----------------------------------------


async def test_case5_a_time_namespace_offset_sees_no_expired_lease(tmp_path: Path) -> None:
    """CLOCK_BOOTTIME is per time namespace: a sidecar whose clock is a day ahead must not
    read the leader's live lease as expired."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is needed")
    probe = await asyncio.create_subprocess_exec(
        unshare, "--time", "--boottime", "86400", "--fork", "true"
    )
    if await probe.wait() != 0:
        pytest.skip("this kernel or sandbox refuses time namespaces")
    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a"], store) as first:
        async with observing(first) as observer:
            leader = await observer.leader(timeout=10)
            shifted = SidecarProcess.start(
                "b",
                store,
                lease_duration=f"{LEASE}s",
                prefix=[
                    unshare, "--time", "--boottime", "86400", "--monotonic", "86400",
                    "--fork", "--kill-child",
                ],
            )  # fmt: skip
            try:
                observer.watch(shifted)
                await hold_steady(observer, 4 * LEASE)
                now = await observer.leader(timeout=5, after=time.time())
                assert (now.identity, now.term) == (leader.identity, leader.term)
                assert not any(s.leader for s in observer.samples if s.name == "b")
            finally:
                shifted.stop()
