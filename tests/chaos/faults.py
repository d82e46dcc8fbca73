"""Carrying out one scheduled fault against a running `Cluster`, and what it left on record
for the judge: when it began, when it healed, whom it hit, and what was seen meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp

from tests.chaos.apps import DOWN, DOWN_WITHIN, UP, AppMode
from tests.chaos.cluster import Cluster, Slot, lease_of
from tests.chaos.schedule import FaultSpec
from tests.chaos.stores import (
    EtcdStore,
    KubernetesStore,
    PostgresStore,
    QuorumStore,
    ZooKeeperStore,
)
from tests.support.sidecars import Sample, SidecarProcess


@dataclasses.dataclass
class Paused:
    """A replica that was SIGSTOPped while it led: its first answer after SIGCONT must be 503."""

    proc: SidecarProcess
    identity: str
    stopped_at: float
    resumed_at: float


@dataclasses.dataclass
class FaultRecord:
    spec: FaultSpec
    began: float = 0.0  # wall clock
    healed: float = 0.0  # the fault is over: from here a leader is due within the bound
    recovered: Sample | None = None  # the first 200 for a request sent after `healed`
    ended: float = 0.0  # the next fault may begin
    targets: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    paused: Paused | None = None


FaultAction = Callable[[Cluster, FaultSpec, FaultRecord], Awaitable[None]]


def who(proc: SidecarProcess) -> str:
    return f"{proc.name}({proc.identity})"


async def pick_target(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> Slot:
    """The current leader, or a follower chosen by rank; with no leader now, any slot."""
    leader = await cluster.leader_now(timeout=2 * cluster.lease + 2)
    if spec.target == "leader" and leader is not None:
        slot = cluster.slot_of(leader.name)
        record.targets.append(f"leader {who(slot.proc)} term {leader.term}")
        return slot
    others = [slot for slot in cluster.slots if leader is None or slot.name != leader.name]
    slot = others[int(spec.pick * len(others))]
    role = "follower" if leader is not None else "replica (no leader now)"
    record.targets.append(f"{role} {who(slot.proc)}")
    return slot


# -- the sidecar processes ---------------------------------------------------------------------


async def sigkill(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    slot = await pick_target(cluster, spec, record)
    proc = slot.proc
    slot.ended_on_purpose.add(proc.proc.pid)
    record.began = time.time()
    await asyncio.to_thread(proc.kill)
    replacement = await cluster.launch(slot)
    record.notes.append(f"replaced by {who(replacement)}")
    record.healed = time.time()


async def sigstop(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    slot = await pick_target(cluster, spec, record)
    proc = slot.proc
    was_leader = spec.target == "leader" and record.targets[-1].startswith("leader")
    record.began = time.time()
    proc.pause()
    await asyncio.sleep(spec.hold)  # the pause itself: past the lease on purpose
    resumed_at = time.time()
    proc.resume()
    if was_leader:
        record.paused = Paused(proc, proc.identity, record.began, resumed_at)
    record.healed = resumed_at


async def sigterm(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    slot = await pick_target(cluster, spec, record)
    proc = slot.proc
    slot.ended_on_purpose.add(proc.proc.pid)
    record.began = time.time()
    proc.terminate()
    try:
        code = await asyncio.to_thread(proc.wait_exit, 5.0)
        record.notes.append(f"exited {code} after {time.time() - record.began:.2f}s")
    except Exception:
        record.notes.append("did NOT exit within 5s of SIGTERM; killed")
        await asyncio.to_thread(proc.stop)
    replacement = await cluster.launch(slot)
    record.notes.append(f"restarted as {who(replacement)}")
    record.healed = time.time()


async def clock_step_sidecar(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    slot = await pick_target(cluster, spec, record)
    record.began = time.time()
    slot.clock.step(spec.step)
    await asyncio.sleep(spec.hold)
    slot.clock.step(0.0)  # and back: a second step, the other way
    record.healed = time.time()


# -- the store ---------------------------------------------------------------------------------


async def store_stall(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await cluster.store.stall(spec.hold)
    record.healed = time.time()


async def store_restart(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await cluster.store.lose_state()
    record.healed = time.time()


async def store_restart_twice(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await cluster.store.lose_state()
    await asyncio.sleep(spec.gap)  # a crash-looping store
    await cluster.store.lose_state()
    record.healed = time.time()


def highest_term(samples: list[Sample]) -> int:
    return max((s.term for s in samples if s.term is not None), default=0)


async def release(proc: SidecarProcess, lease: str | None = None) -> None:
    """POST /leader/release the way a local program must (the header, see docs/security.md);
    a refusal would quietly turn the fault into another one, so it fails the run. ``lease``:
    that lease only (a sharded run), else every lease held."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
        session.post(
            f"http://{proc.local}/leader/release",
            headers={"X-Leader-Sidecar": "release"},
            json=None if lease is None else {"lease": lease},
        ) as response,
    ):
        await response.read()
        assert response.status == 200, f"release refused: HTTP {response.status}"


async def delete_after_grant(
    cluster: Cluster, spec: FaultSpec, record: FaultRecord, *, twice: bool = False
) -> None:
    """Provoke a grant (the leader releases), then delete the record the moment the observer
    sees the new term: before the other replicas may have seen it (case 2 of issue 9)."""
    if cluster.shards:
        await delete_shard_after_grant(cluster, spec, record, twice=twice)
        return
    observer = cluster.observer
    leader = await cluster.leader_now(timeout=2 * cluster.lease + 2)
    before = highest_term(observer.samples)
    record.began = time.time()
    if leader is not None:
        releasing = cluster.slot_of(leader.name).proc
        record.targets.append(f"released by {who(releasing)} term {leader.term}")
        try:
            await release(releasing)
        except (TimeoutError, aiohttp.ClientError) as exc:
            record.notes.append(f"release failed: {exc!r}")
    try:
        grant = await observer.wait_for(
            lambda s: s.leader and (s.term or 0) > before, timeout=2 * cluster.lease + 2
        )
    except AssertionError:
        record.notes.append("no new grant seen; deleted anyway")
        grant = None
    await cluster.store.delete_record()
    if grant is not None:
        record.notes.append(
            f"deleted {1000 * (time.time() - grant.received):.0f}ms after seeing the grant of "
            f"term {grant.term} to {grant.name}({grant.identity})"
        )
    if twice:
        floor = max(before, (grant.term or 0) if grant else 0)
        try:
            second = await observer.wait_for(
                lambda s: s.leader and (s.term or 0) > floor, timeout=spec.gap
            )
            record.notes.append(f"second grant term {second.term} to {second.name}")
        except AssertionError:
            record.notes.append(f"no grant within {spec.gap:.2f}s")
        await cluster.store.delete_record()
        record.notes.append("deleted again")
    record.healed = time.time()


async def delete_shard_after_grant(
    cluster: Cluster, spec: FaultSpec, record: FaultRecord, *, twice: bool
) -> None:
    """`delete_after_grant` on one shard, chosen by the seed: its holder releases it (that
    lease only), and its record alone is deleted the moment its new term is seen."""
    observer = cluster.observer
    lease = cluster.shard_names()[int(spec.pick * cluster.shards)]
    stored = cluster.store.store_name(lease)
    asked = time.time()
    try:
        leader: Sample | None = await observer.wait_for(
            lambda s: s.leader and lease_of(s) == lease and s.sent >= asked,
            timeout=2 * cluster.lease + 2,
        )
    except AssertionError:
        leader = None
    mine = [s for s in observer.samples if lease_of(s) == lease]
    before = highest_term(mine)
    record.began = time.time()
    if leader is not None:
        releasing = cluster.slot_of(leader.name).proc
        record.targets.append(f"{lease} released by {who(releasing)} term {leader.term}")
        try:
            await release(releasing, lease)
        except (TimeoutError, aiohttp.ClientError) as exc:
            record.notes.append(f"release failed: {exc!r}")
    else:
        record.targets.append(f"{lease} (no leader now)")

    async def granted(floor: int, timeout: float) -> Sample:
        return await observer.wait_for(
            lambda s: s.leader and lease_of(s) == lease and (s.term or 0) > floor, timeout
        )

    try:
        grant: Sample | None = await granted(before, 2 * cluster.lease + 2)
    except AssertionError:
        record.notes.append("no new grant seen; deleted anyway")
        grant = None
    await cluster.store.delete_record(stored)
    if grant is not None:
        record.notes.append(
            f"deleted {1000 * (time.time() - grant.received):.0f}ms after seeing the grant of "
            f"term {grant.term} to {grant.name}({grant.identity})"
        )
    if twice:
        floor = max(before, (grant.term or 0) if grant else 0)
        try:
            second = await granted(floor, spec.gap)
            record.notes.append(f"second grant term {second.term} to {second.name}")
        except AssertionError:
            record.notes.append(f"no grant within {spec.gap:.2f}s")
        await cluster.store.delete_record(stored)
        record.notes.append("deleted again")
    record.healed = time.time()


async def delete_after_grant_once(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    await delete_after_grant(cluster, spec, record)


async def delete_after_grant_twice(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    await delete_after_grant(cluster, spec, record, twice=True)


async def partition(cluster: Cluster, spec: FaultSpec, record: FaultRecord, mode: str) -> None:
    slot = await pick_target(cluster, spec, record)
    proxy = cluster.store.proxy(slot.name)
    assert proxy is not None, f"{cluster.store.name} has no proxy to partition"
    record.began = time.time()
    proxy.set_mode("blackhole" if mode == "blackhole" else "reset")
    await asyncio.sleep(spec.hold)
    proxy.set_mode("open")
    record.healed = time.time()


async def partition_blackhole(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    await partition(cluster, spec, record, "blackhole")


async def partition_reset(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    await partition(cluster, spec, record, "reset")


async def clock_step_store(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    clock = cluster.store.host_clock
    assert clock is not None, f"{cluster.store.name} has no steppable host clock"
    record.began = time.time()
    clock.step(spec.step)
    await asyncio.sleep(spec.hold)
    clock.step(0.0)
    record.healed = time.time()


def kube(cluster: Cluster) -> KubernetesStore:
    assert isinstance(cluster.store, KubernetesStore)
    return cluster.store


async def api_5xx(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    status = 500 if spec.pick < 0.5 else 503
    record.targets.append(f"every lease request answered {status}")
    record.began = time.time()
    await kube(cluster).errors(status, spec.hold)
    record.healed = time.time()


async def late_write(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await kube(cluster).late_write(spec.hold)
    record.healed = time.time()


# -- etcd and ZooKeeper: their members ----------------------------------------------------------


def etcd(cluster: Cluster) -> EtcdStore:
    assert isinstance(cluster.store, EtcdStore)
    return cluster.store


def quorum(cluster: Cluster) -> QuorumStore:
    assert isinstance(cluster.store, QuorumStore)
    return cluster.store


async def member_sigkill(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    store = quorum(cluster)
    member = await asyncio.to_thread(store.target, spec.pick)
    record.targets.append(f"member {member.name}")
    record.began = time.time()
    member.kill()
    await asyncio.sleep(spec.hold)
    await asyncio.to_thread(member.restart)
    await asyncio.to_thread(store.wait_ready)
    record.healed = time.time()


async def member_sigstop(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    store = quorum(cluster)
    member = await asyncio.to_thread(store.target, spec.pick)
    record.targets.append(f"member {member.name}")
    record.began = time.time()
    member.pause()
    try:
        await asyncio.sleep(spec.hold)
    finally:
        member.resume()
    record.healed = time.time()


async def quorum_lost(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    store = quorum(cluster)
    lost = store.members[1:] if spec.pick < 0.5 else store.members[:2]
    record.targets.append("members " + ",".join(m.name for m in lost))
    record.began = time.time()
    for member in lost:
        member.kill()
    await asyncio.sleep(spec.hold)
    for member in lost:
        await asyncio.to_thread(member.restart)
    await asyncio.to_thread(store.wait_ready)
    record.healed = time.time()


async def member_partition(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    store = quorum(cluster)
    member = await asyncio.to_thread(store.cut_off_target, spec.pick)
    proxy = store.peer_proxies[member.name]
    record.targets.append(f"member {member.name} cut off from its peers")
    record.began = time.time()
    proxy.set_mode("blackhole" if spec.pick < 0.5 else "reset")
    await asyncio.sleep(spec.hold)
    proxy.set_mode("open")
    record.healed = time.time()


def zookeeper(cluster: Cluster) -> ZooKeeperStore:
    assert isinstance(cluster.store, ZooKeeperStore)
    return cluster.store


async def ensemble_restart(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """Every member killed at once, down for the hold, then started again on its data (a
    power cut of the whole ensemble): nothing is lost, the leader must demote meanwhile."""
    record.began = time.time()
    await zookeeper(cluster).restart_all(spec.hold)
    record.healed = time.time()


async def snapshot_restore(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """A snapshot, then a grant (the leader releases) and renewals after it, then every
    member restored from the snapshot: etcd shows an older term and holder, its revision
    goes back (the store loss of etcd)."""
    store = etcd(cluster)
    snapshot = store.cluster.directory / f"snapshot-{spec.index}.db"
    record.began = time.time()
    await asyncio.to_thread(store.cluster.save_snapshot, snapshot)
    before = highest_term(cluster.observer.samples)
    leader = await cluster.leader_now(timeout=2 * cluster.lease + 2)
    if leader is not None:
        record.targets.append(f"released by {who(cluster.slot_of(leader.name).proc)}")
        try:
            await release(cluster.slot_of(leader.name).proc)
        except (TimeoutError, aiohttp.ClientError, AssertionError) as exc:
            record.notes.append(f"release failed: {exc!r}")
    try:
        grant = await cluster.observer.wait_for(
            lambda s: s.leader and (s.term or 0) > before, timeout=2 * cluster.lease + 2
        )
        record.notes.append(f"grant of term {grant.term} after the snapshot")
    except AssertionError:
        record.notes.append("no new grant after the snapshot")
    await asyncio.sleep(spec.gap)
    await asyncio.to_thread(store.cluster.restore_snapshot, snapshot)
    record.notes.append(f"restored to the snapshot of term <= {before}")
    record.healed = time.time()


def postgres(cluster: Cluster) -> PostgresStore:
    assert isinstance(cluster.store, PostgresStore)
    return cluster.store


async def store_pause(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await postgres(cluster).pause(spec.hold)
    record.healed = time.time()


async def store_crash(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await postgres(cluster).crash()
    record.healed = time.time()


async def terminate_sessions(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    ended = await postgres(cluster).terminate_sessions()
    record.notes.append(f"{ended} session(s) terminated")
    record.healed = time.time()


async def store_failover(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    record.began = time.time()
    await postgres(cluster).failover()
    record.healed = time.time()


# -- the apps (the app-fault round) ---------------------------------------------------------


def app_rng(spec: FaultSpec) -> random.Random:
    """More seeded choices for one app fault than its spec carries (a function of the spec,
    so of the seed)."""
    return random.Random(f"{spec.index}/{spec.kind}/{spec.pick}/{spec.hold}")


def on_an_up_app(cluster: Cluster, sample: Sample) -> bool:
    """A 200 from a slot whose app was up while the request was out: the job is done."""
    app = cluster.apps[sample.name]
    return sample.leader and app.up_at(sample.sent) and app.up_at(sample.received)


async def note_job(
    cluster: Cluster, record: FaultRecord, since: float, what: str, timeout: float = 0.05
) -> None:
    """Informational (the judge decides): how soon after ``since`` a slot whose app is up led
    (waiting at most ``timeout``)."""
    try:
        sample = await cluster.observer.wait_for(
            lambda s: s.sent >= since and on_an_up_app(cluster, s), timeout=timeout
        )
    except AssertionError:
        record.notes.append(f"{what}: not on an up app yet")
        return
    record.notes.append(
        f"{what}: on {sample.name} term {sample.term} after {sample.received - since:.2f}s"
    )


def reigns_begun(cluster: Cluster, low: float, high: float) -> list[str]:
    """Reigns (name:term) whose first 200 the observer saw between ``low`` and ``high``."""
    seen: dict[tuple[str, object], float] = {}
    for sample in cluster.observer.samples:
        if sample.leader and sample.body is not None:
            seen.setdefault((sample.name, sample.term), sample.received)
    return [f"{name}:{term}" for (name, term), at in seen.items() if low <= at <= high]


async def app_kill(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """SIGKILL the target's app, and start it again (same port) after ``hold``."""
    slot = await pick_target(cluster, spec, record)
    app = cluster.apps[slot.name]
    record.began = time.time()
    app.kill()
    await asyncio.sleep(spec.hold)
    await note_job(cluster, record, record.began, "the job")
    await app.start()
    record.healed = time.time()


async def app_hang(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """SIGSTOP the target's app (its health check times out; its writer holds the write it
    was about to make), then SIGCONT after ``hold``."""
    slot = await pick_target(cluster, spec, record)
    app = cluster.apps[slot.name]
    record.began = time.time()
    app.hang()
    try:
        await asyncio.sleep(spec.hold)
        await note_job(cluster, record, record.began, "the job")
    finally:
        app.resume()
    record.healed = time.time()


async def app_flap(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """The target's app flaps: first faster than the failure threshold (503 spells shorter
    than two check periods, so never ``failures`` checks in a row: it should keep counting as
    up), for ``hold``; then slower (503 spells past the threshold), two cycles; then up."""
    rng = app_rng(spec)
    slot = await pick_target(cluster, spec, record)
    app = cluster.apps[slot.name]
    fast = AppMode("flap", time.time(), rng.uniform(0.12, 0.18), rng.uniform(0.2, 0.3))
    record.began = fast.origin
    app.set_mode(fast)
    await asyncio.sleep(spec.hold)
    slow_at = time.time()
    slow = AppMode("flap", slow_at, rng.uniform(0.7, 1.2), rng.uniform(0.7, 1.2))
    app.set_mode(slow)
    record.notes.append(
        f"fast {fast.down:.2f}s down/{fast.up:.2f}s up: new reigns "
        f"{reigns_begun(cluster, fast.origin, slow_at) or 'none'}"
    )
    await asyncio.sleep(2 * (slow.down + slow.up))
    app.set_mode(UP)
    record.healed = time.time()
    record.notes.append(
        f"slow {slow.down:.2f}s down/{slow.up:.2f}s up x2: new reigns "
        f"{reigns_begun(cluster, slow_at, record.healed) or 'none'}"
    )


async def apps_down(cluster: Cluster, spec: FaultSpec, record: FaultRecord) -> None:
    """Every app down at once, each its own seeded way (killed, hung or answering 503), for
    twice ``hold``: nobody whose app is down may be handed the lease, and the leader keeps
    it (the specified behaviour). Then the apps come back one by one, ``gap`` apart, in a
    seeded order: the first one back should get the job within the bound."""
    rng = app_rng(spec)
    leader = await cluster.leader_now(timeout=2 * cluster.lease + 2)
    ways = {name: rng.choice(("kill", "hang", "unready")) for name in cluster.apps}
    order = list(cluster.apps)
    rng.shuffle(order)
    record.targets.append(f"leader {leader.name} term {leader.term}" if leader else "no leader now")
    record.targets.append(", ".join(f"{name} {way}" for name, way in ways.items()))
    record.began = time.time()
    for name, way in ways.items():
        app = cluster.apps[name]
        if way == "kill":
            app.kill()
        elif way == "hang":
            app.hang()
        else:
            app.set_mode(DOWN)
    all_down = time.time()
    await asyncio.sleep(2 * spec.hold)
    # Past the check's reaction time, a new reign would be a grant to a replica whose app
    # is down: none is expected (informational; the fence and the observer judge safety).
    record.notes.append(
        f"all down {time.time() - all_down:.2f}s: new reigns after {DOWN_WITHIN:.1f}s: "
        f"{reigns_begun(cluster, all_down + DOWN_WITHIN + 0.2, time.time()) or 'none'}"
    )
    back = []
    for position, name in enumerate(order):
        app = cluster.apps[name]
        if position:
            await asyncio.sleep(spec.gap)
        if ways[name] == "kill":
            await app.start()
        elif ways[name] == "hang":
            app.resume()
        else:
            app.set_mode(UP)
        back.append((name, time.time()))
    record.healed = time.time()
    first, first_at = back[0]
    record.notes.append("back in order " + ",".join(name for name, _at in back))
    await note_job(cluster, record, first_at, f"the job after {first} came back", timeout=3.0)


ACTIONS: dict[str, FaultAction] = {
    "sigkill": sigkill,
    "sigstop": sigstop,
    "sigterm": sigterm,
    "clock_step_sidecar": clock_step_sidecar,
    "store_stall": store_stall,
    "store_restart": store_restart,
    "store_restart_twice": store_restart_twice,
    "delete_after_grant": delete_after_grant_once,
    "delete_after_grant_twice": delete_after_grant_twice,
    "partition_blackhole": partition_blackhole,
    "partition_reset": partition_reset,
    "clock_step_store": clock_step_store,
    "api_5xx": api_5xx,
    "late_write": late_write,
    "member_sigkill": member_sigkill,
    "member_sigstop": member_sigstop,
    "quorum_lost": quorum_lost,
    "member_partition": member_partition,
    "snapshot_restore": snapshot_restore,
    "ensemble_restart": ensemble_restart,
    "store_pause": store_pause,
    "store_crash": store_crash,
    "terminate_sessions": terminate_sessions,
    "store_failover": store_failover,
    "app_kill": app_kill,
    "app_hang": app_hang,
    "app_flap": app_flap,
    "apps_down": apps_down,
}
