"""One trial of each measure, on a pool of three replicas of one system. Trials of our sidecar
and of the anchor run side by side (`asyncio.gather`) so both see the same machine noise;
hand-offs, a few milliseconds long, run in turn instead (see `benchmarks.run`).

Times are wall-clock seconds on this host. "Leads since" is the replica's own ``since``
(millisecond precision); "stops claiming" is the first non-200 the observer (polling every
replica's ``/leader`` every 10 ms) received; "the lease could first be taken" is the store's
own record of the last write to the lease (the fake's request log, Redis ``MONITOR``) plus the
lease duration."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp

from benchmarks.processes import rss_mib
from benchmarks.systems import Replica, System
from tests.support.sidecars import LeaderObserver, Sample

POLL = 0.01  # the observer's interval per replica


class Pool:
    """Three replicas of one system, polled by one observer for the pool's life; a replica
    that was killed or stopped is replaced by a fresh process in the same slot."""

    def __init__(self, system: System, size: int = 3) -> None:
        self.system = system
        self.size = size
        self.replicas: list[Replica] = []
        self.slots: dict[str, str] = {}
        self.generation = 0
        self.observer = LeaderObserver([], interval=POLL)

    async def __aenter__(self) -> Pool:
        await self.observer.__aenter__()
        for slot in range(self.size):
            await self._spawn(str(slot))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.observer.__aexit__(*exc)
        for replica in self.replicas:
            await asyncio.to_thread(replica.stop)

    async def _spawn(self, slot: str) -> Replica:
        self.generation += 1
        prefix = "ours" if self.system.ours else "anchor"
        name = f"{prefix}-{slot}-{self.generation}"
        replica = await asyncio.to_thread(self.system.start, name, slot)
        self.replicas.append(replica)
        self.slots[replica.name] = slot
        self.observer.watch(replica)  # type: ignore[arg-type]
        return replica

    async def replace(self, replica: Replica) -> None:
        await asyncio.to_thread(replica.stop)
        self.replicas.remove(replica)
        await self._spawn(self.slots.pop(replica.name))

    def by_name(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    async def leader(self, after: float | None = None) -> tuple[Sample, Replica]:
        """A replica answering 200 to a request sent after ``after`` (default: now)."""
        moment = time.time() if after is None else after
        sample = await self.observer.wait_for(
            lambda s: (
                s.leader and s.sent >= moment and any(r.name == s.name for r in self.replicas)
            ),
            timeout=self.system.lease * 4 + 10,
        )
        return sample, self.by_name(sample.name)

    async def settle(self) -> tuple[Sample, Replica]:
        """Wait for a leader, then a random moment within a renew interval after at least one
        renewal (never right after one)."""
        sample, leader = await self.leader()
        renew = self.system.renew
        await asyncio.sleep(renew + random.uniform(0, renew))
        return sample, leader

    async def first_not_leader(self, name: str, after: float, timeout: float) -> Sample | None:
        try:
            return await self.observer.wait_for(
                lambda s: s.name == name and s.status != 200 and s.sent >= after, timeout=timeout
            )
        except AssertionError:
            return None


async def quiet(pools: list[Pool], share: float = 0.1, window: float = 0.1,
                timeout: float = 5.0) -> float:  # fmt: skip
    """Wait until every replica of ``pools`` together uses under ``share`` of one CPU over
    ``window`` seconds (at most ``timeout``); returns the seconds waited. A replacement process
    spends a second or so of CPU after it answers (imports, its first store round trips): on 2
    cores, a hand-off of a few milliseconds that lands inside that measures the start-up, not the
    hand-off — for either system."""
    began = time.monotonic()
    while True:
        before = _cpu_seconds(pools)
        await asyncio.sleep(window)
        used = _cpu_seconds(pools) - before
        if used < share * window or time.monotonic() - began >= timeout:
            return time.monotonic() - began


def _cpu_seconds(pools: list[Pool]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pool in pools:
        for replica in pool.replicas:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{replica.proc.pid}/stat").read_text().rsplit(")", 1)[1]
                utime, stime = fields.split()[11:13]
                total += int(utime) + int(stime)
    return total / ticks


# -- the trials ------------------------------------------------------------------------------


async def crash(pool: Pool) -> tuple[float | None, float, list[float]]:
    """SIGKILL the leader at a random moment in its renew interval: (seconds from the moment
    the lease could first be taken to the successor's reign, the leader's RSS just before,
    the followers' RSS)."""
    first, leader = await pool.settle()
    rss = (
        rss_mib(getattr(leader, "measured_pid", leader.proc.pid)),
        [rss_mib(getattr(r, "measured_pid", r.proc.pid)) for r in pool.replicas if r is not leader],
    )
    killed = time.time()
    leader.signal(signal.SIGKILL)
    await asyncio.to_thread(leader.proc.wait, 5)
    try:
        successor = await pool.observer.wait_for(
            lambda s: s.leader and s.name != first.name and s.sent >= killed,
            timeout=successor_timeout(pool),
        )
    except AssertionError:
        print(f"  {pool.system.label}: no successor after SIGKILL", flush=True)
        await pool.replace(leader)
        return None, *rss
    await asyncio.sleep(0.2)  # MONITOR lines are read on a thread
    last = await asyncio.to_thread(pool.system.last_write_before, killed)
    assert last is not None, "no write to the lease seen at the store"
    await pool.replace(leader)
    return successor.since - (last + pool.system.lease), *rss


async def handoff(pool: Pool, quiet_for: list[Pool] | None = None) -> float | None:
    """SIGTERM the leader: seconds until another replica leads (None: nobody led within
    ``successor_timeout``; the signalled process is then killed and the run goes on).
    ``quiet_for``: first wait until these pools' replicas are quiet (`quiet`)."""
    first, leader = await pool.settle()
    if quiet_for:
        await quiet(quiet_for)
    began = time.time()
    leader.signal(signal.SIGTERM)
    try:
        successor = await pool.observer.wait_for(
            lambda s: s.leader and s.name != first.name and s.sent >= began,
            timeout=successor_timeout(pool),
        )
    except AssertionError:
        exited = leader.proc.poll()
        print(
            f"  {pool.system.label}: no successor after SIGTERM; exit status {exited}", flush=True
        )
        await pool.replace(leader)
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(leader.proc.wait, 10)
    await pool.replace(leader)
    return successor.since - began


def successor_timeout(pool: Pool) -> float:
    return pool.system.lease * 4 + 10


async def takeover(pool: Pool) -> float | None:
    """Another identity is granted the lease at the store: seconds until the old leader stops
    claiming (None: still claiming after 3 leases)."""
    _, leader = await pool.settle()
    began = await asyncio.to_thread(pool.system.takeover)  # when the write was sent
    stopped = await pool.first_not_leader(leader.name, began, pool.system.lease * 3)
    if stopped is None:
        return None
    await pool.leader(after=stopped.received)  # the intruder's lease ran out; a new leader
    return stopped.received - began


async def stalled(
    pools: list[Pool], stall: object, unstall: object, cap: float
) -> list[float | None]:
    """The store stops answering (everyone's requests hang) for ``cap`` seconds: per pool, the
    leader's first non-200 minus the moment another replica could have been granted the lease
    (last write + lease); negative is before. None: it claimed through the whole stall."""
    settled = await asyncio.gather(*(pool.settle() for pool in pools))
    began = time.time()
    await asyncio.to_thread(stall)  # type: ignore[arg-type]
    # The store is stalled from here on. A write done between `began` and now counted for its
    # leader, so the earliest take is reckoned from here (measured from `began`, one trial read
    # +0.48 s: exactly one renew interval late, a renewal that landed in between uncounted).
    stalled_at = time.time()
    try:
        stops = await asyncio.gather(
            *(
                pool.first_not_leader(leader.name, began, cap)
                for pool, (_, leader) in zip(pools, settled, strict=True)
            )
        )
    finally:
        await asyncio.to_thread(unstall)  # type: ignore[arg-type]
    back = time.time()
    await asyncio.sleep(0.2)
    results: list[float | None] = []
    for pool, stop in zip(pools, stops, strict=True):
        last = await asyncio.to_thread(pool.system.last_write_before, stalled_at)
        assert last is not None
        results.append(None if stop is None else stop.received - (last + pool.system.lease))
    await asyncio.gather(*(pool.leader(after=back) for pool in pools))
    return results


async def split_brain(pool: Pool) -> float | None:
    """SIGSTOP the leader for two leases (another takes over), SIGCONT: seconds during which
    both claimed (the old leader's last 200 after resuming).

    Only answers to requests sent after SIGSTOP count: those can only have been computed after
    SIGCONT. An answer computed just before the pause can reach the client after it; no
    ``/leader`` can prevent that (the term and ``valid_for_seconds`` are for that), so such
    answers are only reported on stdout."""
    first, leader = await pool.settle()
    leader.signal(signal.SIGSTOP)
    paused = time.time()
    await asyncio.sleep(pool.system.lease * 2)
    resumed = time.time()
    leader.signal(signal.SIGCONT)
    other = [
        s for s in pool.observer.samples if s.leader and s.name != first.name and s.sent >= paused
    ]
    if not other:
        # Nobody could: a session lock stays with a paused process (its socket is open). No
        # split brain, and no failover either; the row says so.
        await pool.leader()
        return None
    await pool.first_not_leader(leader.name, resumed, pool.system.lease * 4)
    for s in pool.observer.samples:
        if s.name == first.name and s.leader and s.sent < paused and s.received >= resumed:
            print(
                f"  {pool.system.label}: a 200 sent {paused - s.sent:.3f} s before SIGSTOP "
                f"arrived {s.received - resumed:.3f} s after SIGCONT: {s.body}",
                flush=True,
            )
    late = [
        s.received
        for s in pool.observer.samples
        if s.name == first.name and s.leader and s.sent >= paused and s.received >= resumed
    ]
    await pool.leader()
    return max(late) - resumed if late else 0.0


async def split_brain_partition(pool: Pool) -> float | None:
    """Cut the leader off the store (its connections black-holed, as a network that drops
    packets) for two leases, then heal: seconds during which both claimed, counting only
    answers to requests sent after another replica led. None: nobody took over."""
    first, leader = await pool.settle()
    cut = time.time()
    pool.system.partition(pool.slots[leader.name], True)  # type: ignore[attr-defined]
    try:
        await asyncio.sleep(pool.system.lease * 2)
    finally:
        pool.system.partition(pool.slots[leader.name], False)  # type: ignore[attr-defined]
    healed = time.time()
    other = [
        s for s in pool.observer.samples if s.leader and s.name != first.name and s.sent >= cut
    ]
    if not other:
        await pool.leader()
        return None
    took_over = min(s.received for s in other)
    both = [
        s.received
        for s in pool.observer.samples
        if s.name == first.name and s.leader and s.sent >= took_over
    ]
    await pool.first_not_leader(leader.name, healed, pool.system.lease * 4)
    await pool.leader()
    return max(both) - took_over if both else 0.0


async def store_rates(pool: Pool, seconds: float = 1.0) -> tuple[float, list[float]]:
    """Store requests per second over one window: (the leader's, each follower's)."""
    _, leader = await pool.leader()
    # A store with a counter of its own per replica (ZooKeeper: a proxy per replica reading
    # the wire protocol) counts both systems alike.
    counter = getattr(pool.system, "store_requests", None)

    async def count(session: aiohttp.ClientSession, replica: Replica) -> float:
        if counter is not None:
            return float(counter(pool.slots[replica.name]))
        return await _store_requests(session, replica)

    async with aiohttp.ClientSession() as session:
        before = {r.name: await count(session, r) for r in pool.replicas}
        await asyncio.sleep(seconds)
        after = {r.name: await count(session, r) for r in pool.replicas}
    rates = {name: (after[name] - before[name]) / seconds for name in before}
    return rates[leader.name], [v for k, v in rates.items() if k != leader.name]


async def _store_requests(session: aiohttp.ClientSession, replica: Replica) -> float:
    public = getattr(replica, "public", "")
    if public:  # ours: the metrics
        async with session.get(f"http://{public}/metrics") as response:
            text = await response.text()
        return sum(
            float(m.group(1))
            for m in re.finditer(
                r"^leader_sidecar_store_requests_total\{[^}]*\} ([\d.e+]+)$", text, re.M
            )
        )
    async with session.get(replica.leader_url) as response:  # the anchors count their own
        return float((await response.json())["store_requests"])


async def start_to_leader(system: System, slot: str) -> float:
    """One process on an empty lease: seconds from spawning it to its reign."""
    await asyncio.to_thread(system.reset)
    began = time.time()
    replica = await asyncio.to_thread(system.start, f"start-{slot}", "start")
    try:
        async with LeaderObserver([replica], interval=POLL) as observer:  # type: ignore[list-item]
            sample = await observer.leader(timeout=system.lease * 4 + 10)
    finally:
        await asyncio.to_thread(replica.stop)
    return sample.since - began
