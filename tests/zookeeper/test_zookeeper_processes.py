"""Real ``leader-sidecar`` processes on a real three-member ZooKeeper ensemble, watched every
10 ms for the whole test by `LeaderObserver` (never two 200s from different replicas at one
instant): the ensemble loses its quorum and gets it back; one member is cut off from the
others with a sidecar that knows only it; every member's data is wiped and the ensemble started
again empty (a store that lost its state, rule 8); ``status`` reads what a digest user's sidecars
wrote, and the password reaches no log line."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.support.sidecars import (
    REPO,
    LeaderObserver,
    SidecarProcess,
    observing,
    sidecars,
    signal_leader,
)
from tests.zookeeper.servers import Ensemble, Member, ensemble, fresh_chroot, shared_standalone

pytestmark = pytest.mark.slow

# Short, but longer than the client's reconnect back-off (at most 1.5 s): a leader comes back
# within two leases of the ensemble serving again.
LEASE = 2.0


@pytest.fixture
def members() -> Iterator[Ensemble]:
    with ensemble() as started:
        yield started


def assert_fenced(observer: LeaderObserver) -> None:
    """Every new reign carries a higher term than every earlier one (rule 5)."""
    seen = sorted({(s.since, s.term, s.identity) for s in observer.samples if s.leader and s.term})
    terms = [term for _since, term, _identity in seen]
    assert terms == sorted(terms), seen
    assert len(set(terms)) == len(terms), seen


def unavailable_logged(procs: list[SidecarProcess]) -> bool:
    return any(
        entry.get("msg") in ("zookeeper unavailable", "zookeeper connection lost")
        for proc in procs
        for entry in proc.logs
    )


async def wait_serving(member_list: list[Member]) -> None:
    for member in member_list:
        await asyncio.to_thread(member.wait_serving)


async def test_without_quorum_the_leader_demotes_at_its_deadline_and_no_one_leads(
    members: Ensemble,
) -> None:
    """Two of three members stopped (the ensemble's leader among them): the last one stops
    serving, so renewals fail, the leader answers 503 at its own deadline and nobody leads
    while the quorum is lost. Started again: a leader within two leases of the ensemble
    serving, under a term at least as high. The server operations block, so they run in
    threads while the observer keeps polling."""
    zk_leader = members.leader()
    follower = next(m for m in members.members if m is not zk_leader)
    stopped = [zk_leader, follower]
    url = members.url(fresh_chroot("quorum"))
    with sidecars(["a", "b", "c"], url, lease_duration=f"{LEASE:g}s") as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            lost_at = time.time()
            await asyncio.gather(*(asyncio.to_thread(m.stop) for m in stopped))
            demoted = await observer.wait_for(
                lambda s: s.name == first.name and not s.leader and s.sent >= lost_at,
                timeout=LEASE + 1,
            )
            assert demoted.received < lost_at + LEASE + 0.3, (demoted, lost_at)
            # Nobody may lead for as long as the quorum stays lost: watch two more leases.
            await asyncio.sleep(2 * LEASE)
            back_at = time.time()
            for member in stopped:
                await asyncio.to_thread(member.launch)
            await wait_serving(members.members)
            serving_at = time.time()
            during = [s for s in observer.samples if s.leader and demoted.sent <= s.sent < back_at]
            assert not during, during[:3]
            again = await observer.leader(timeout=2 * LEASE + 2, after=serving_at)
            assert again.sent - serving_at <= 2 * LEASE, (again, serving_at)
            assert again.term is not None
            assert first.term is not None
            assert again.term >= first.term
            assert unavailable_logged(procs), "no sidecar said zookeeper was unavailable"
    observer.assert_never_two_leaders()
    assert_fenced(observer)


async def test_a_sidecar_that_reaches_only_a_partitioned_minority_never_leads(
    members: Ensemble,
) -> None:
    """One member cut off from the other two (`Member.isolate`): the two go on serving and
    elect a leader among the sidecars that reach them; the sidecar that reaches only the lone
    member never gets a session, and never leads, for three leases of a held lease."""
    lone = members.members[2]
    majority = members.members[:2]
    await asyncio.to_thread(lone.isolate)
    await wait_serving(majority)
    assert lone.running()
    assert not lone.serving()
    chroot = fresh_chroot("partition")
    with sidecars(["a", "b"], members.url(chroot), lease_duration=f"{LEASE:g}s") as procs:
        cut_off = SidecarProcess.start(
            "c", members.url(chroot, [lone]), lease_duration=f"{LEASE:g}s"
        )
        try:
            async with observing([*procs, cut_off]) as observer:
                leader = await observer.leader()
                assert leader.name in ("a", "b")
                watched_from = time.time()
                await asyncio.sleep(3 * LEASE)
                assert not lone.serving()
                seen = [s for s in observer.samples if s.name == "c" and s.sent >= watched_from]
                assert seen, "the cut-off sidecar was not observed"
                assert not [s for s in observer.samples if s.name == "c" and s.leader]
                assert unavailable_logged([cut_off])
        finally:
            cut_off.stop()
    observer.assert_never_two_leaders()


def logged_at(procs: list[SidecarProcess], message: str) -> list[float]:
    """When (wall clock, from the log's own stamps) any sidecar logged a line beginning with
    ``message``."""
    return [
        datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()
        for proc in procs
        for entry in proc.logs
        if str(entry.get("msg", "")).startswith(message)
    ]


async def test_an_ensemble_restored_empty_is_waited_out_and_no_term_goes_back(
    members: Ensemble,
) -> None:
    """Rule 8 on ZooKeeper: with three sidecars running, every member's data directory wiped
    and the ensemble started again empty (no lease znode, zxids from zero). The leader demotes
    at its own deadline; every server refuses the sidecars' sessions (they have seen more than
    it), so their client starts anew; the replicas that find the lease gone wait the loss out
    (nobody is granted for a lease after the first of them saw it); leadership returns under a
    term above every term served before, and no term is served by two identities. A hand-off
    first, so that a term counted from the empty store again would show; every sidecar still
    running has seen its term before the wipe (one still starting could not know there was a
    term to lose — rule 8's limit — and CI once wiped before the third had connected). The
    ensemble stays down until the leader demoted: back within a lease, the leader would put
    its grant back and go on leading under its term, as designed (rule 5) — the test once
    raced that."""
    url = members.url(fresh_chroot("restored"))
    with sidecars(["a", "b", "c"], url, lease_duration=f"{LEASE:g}s") as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=2 * LEASE)
            leader = handover.successor
            highest = max(s.term or 0 for s in observer.samples if s.leader)
            assert highest >= 2
            running = [proc.name for proc in procs if proc is not handover.leader]
            await observer.all_seen(highest, running)
            wiped_at = time.time()
            for member in members.members:  # down and empty until the leader's deadline passed
                await asyncio.to_thread(member.wipe)
            demoted = await observer.wait_for(
                lambda s: s.name == leader.name and not s.leader and s.sent >= wiped_at,
                timeout=LEASE + 1,
            )
            assert demoted.received < wiped_at + LEASE + 0.3, (demoted, wiped_at)
            for member in members.members:
                member.launch()
            await asyncio.to_thread(members.wait_serving)
            serving_at = time.time()
            again = await observer.leader(timeout=4 * LEASE + 5, after=serving_at)
            assert again.term is not None
            assert again.term > highest, (again, highest)
            during = [
                s for s in observer.samples if s.leader and demoted.sent <= s.sent < serving_at
            ]
            assert not during, during[:3]
            started_anew = logged_at(
                procs, "every zookeeper server refused this session: starting anew"
            )
            assert started_anew, "no sidecar's client started a new session after the wipe"
            losses = [
                at for at in logged_at(procs, "the store lost the lease's state") if at >= wiped_at
            ]
            assert losses, "no sidecar saw the loss"
            assert again.since >= min(losses) + LEASE - 0.05, (again, min(losses))
    observer.assert_never_two_leaders()
    assert_fenced(observer)
    served: dict[int, set[str]] = {}
    for sample in observer.samples:
        if sample.leader and sample.term is not None and sample.identity is not None:
            served.setdefault(sample.term, set()).add(sample.identity)
    assert all(len(ids) == 1 for ids in served.values()), served


async def test_an_ensemble_restored_from_an_older_snapshot_is_waited_out(
    members: Ensemble,
) -> None:
    """Rule 8 on ZooKeeper, the other way a store loses state: every member's data copied
    while the lease stood at a term (a backup), two more terms granted, then every member
    restored from that copy. The store shows an older grant, of a term below what the
    sidecars saw, to a replica long gone; their sessions are refused (they have seen newer
    zxids) and start anew; they write the highest term seen over that grant, wait it out, and
    lead again under a term above every term served — never one served twice."""
    url = members.url(fresh_chroot("snapshot"))
    with sidecars(["a", "b", "c", "d"], url, lease_duration=f"{LEASE:g}s") as procs:
        async with observing(procs) as observer:
            first = await signal_leader(observer, procs, signal.SIGTERM, within=2 * LEASE)
            backup = {}
            for member in members.members:  # a consistent backup: taken while stopped
                await asyncio.to_thread(member.kill)
                backup[member.name] = member.directory / "backup"
                await asyncio.to_thread(shutil.copytree, member.data_dir, backup[member.name])
            for member in members.members:
                member.launch()
            await asyncio.to_thread(members.wait_serving)
            second = await signal_leader(observer, procs, signal.SIGTERM, within=4 * LEASE)
            assert second.successor.term is not None
            assert first.successor.term is not None
            assert second.successor.term > first.successor.term
            highest = max(s.term or 0 for s in observer.samples if s.leader)
            running = [p.name for p in procs if p not in (first.leader, second.leader)]
            await observer.all_seen(highest, running)
            restored_at = time.time()
            for member in members.members:  # down until the leader's deadline passed
                await asyncio.to_thread(member.kill)
            await observer.wait_for(
                lambda s: s.name == second.successor.name and not s.leader
                and s.sent >= restored_at,
                timeout=LEASE + 1,
            )  # fmt: skip
            for member in members.members:
                await asyncio.to_thread(shutil.rmtree, member.data_dir)
                await asyncio.to_thread(shutil.copytree, backup[member.name], member.data_dir)
                member.launch()
            await asyncio.to_thread(members.wait_serving)
            serving_at = time.time()
            again = await observer.leader(timeout=4 * LEASE + 5, after=serving_at)
            assert again.term is not None
            assert again.term > highest, (again, highest)
            assert logged_at(procs, "every zookeeper server refused this session: starting anew")
            lost = logged_at(procs, "the store lost the lease's state")
            losses = [at for at in lost if at >= restored_at]
            assert losses, "no sidecar saw the restored store's older grant as a loss"
            assert again.since >= min(losses) + LEASE - 0.05, (again, min(losses))
    observer.assert_never_two_leaders()
    assert_fenced(observer)
    served: dict[int, set[str]] = {}
    for sample in observer.samples:
        if sample.leader and sample.term is not None and sample.identity is not None:
            served.setdefault(sample.term, set()).add(sample.identity)
    assert all(len(ids) == 1 for ids in served.values()), served


async def test_status_reads_a_digest_users_lease_and_no_log_shows_the_password() -> None:
    password = "zk-digest-password-of-a-test"
    url = shared_standalone().url(fresh_chroot("status"))
    url = url.replace("zookeeper://", f"zookeeper://app:{password}@")
    with sidecars(["a", "b"], url, lease_duration=f"{LEASE:g}s") as procs:
        async with observing(procs) as observer:
            leader = await observer.leader()
            await observer.wait_for(lambda s: s.name != leader.name and not s.leader, 5)
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "sidecar", "status", "--store", url, "-o", "json"],
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
    assert password not in done.stdout + done.stderr
    assert not [line for proc in procs for line in proc.raw if password in line]
