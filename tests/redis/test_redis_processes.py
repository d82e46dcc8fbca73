"""Real ``leader-sidecar`` processes on real Redis servers, watched every 10 ms for the whole
test by `LeaderObserver` (never two 200s from different replicas at one instant)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.backends.redis import lease_keys
from tests.redis.servers import RedisServer, SentinelGroup, TlsFiles, sentinel_group, wait_until
from tests.support.sidecars import (
    LeaderObserver,
    Sample,
    SidecarProcess,
    by_name,
    observing,
    sidecars,
    signal_leader,
)

pytestmark = pytest.mark.slow

LEASE = 1.0
RENEW = LEASE / 3
RETRY = min(2.0, RENEW)  # the default retry period for this lease
HOLDER, TERM, _CHANNEL = lease_keys("default")


async def metric(proc: SidecarProcess, name: str, **labels: str) -> float:
    """One sample from the sidecar's public /metrics (0 when the series does not exist)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{proc.public}/metrics") as response,
    ):
        text = await response.text()
    wanted = {f'{key}="{value}"' for key, value in labels.items()}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, _, value = line.rpartition(" ")
            found = set(series.partition("{")[2].rstrip("}").split(","))
            if wanted <= found:
                return float(value)
    return 0.0


async def release(proc: SidecarProcess) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{proc.local}/leader/release", headers={"X-Leader-Sidecar": "release"}
        ) as response,
    ):
        assert response.status in (200, 202, 204), await response.text()


def reigns(observer: LeaderObserver) -> list[tuple[float, int, str]]:
    """(since, term, identity) of every distinct reign the observer saw, in start order."""
    seen = {
        (s.since, s.term, s.identity) for s in observer.samples if s.leader and s.term is not None
    }
    return sorted(seen)  # type: ignore[arg-type]


def assert_fenced(observer: LeaderObserver) -> None:
    """Every new reign carries a higher term than every earlier one (rule 5)."""
    terms = [term for _since, term, _identity in reigns(observer)]
    assert terms == sorted(terms), reigns(observer)
    assert len(set(terms)) == len(terms), reigns(observer)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    started = RedisServer.start(tmp_path / "redis")
    yield started
    started.stop()


# -- one server -------------------------------------------------------------------------------


async def test_sigkill_of_the_leader_fails_over_to_a_higher_term_within_the_lease(
    server: RedisServer,
) -> None:
    """The dead leader's key stays (its TTL is garbage collection, 20 leases); a follower that
    has seen its last version unchanged for a lease on its own clock takes it, with the next
    term, about one lease after the last renewal."""
    with sidecars(["a", "b", "c"], server.url) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(
                observer, procs, signal.SIGKILL, within=LEASE + RETRY + 0.5 + 2.0
            )
            assert handover.seconds <= LEASE + RETRY + 0.5
            with server.client() as client:
                holder = json.loads(client.get(HOLDER))["holder"]
            assert holder == handover.successor.identity


async def test_sigterm_of_the_leader_hands_off_in_a_fraction_of_a_second(
    server: RedisServer,
) -> None:
    """The hand-over is published and the successor leads on it, without a write of its own:
    the next term exactly, within a few round trips, not after a lease. (Its candidate beat
    must leave it a lease to lead on: at this 1 s lease a follower beats every renew interval,
    so a beat late on a loaded machine does not turn the hand-over into a write and a term
    more.)"""
    with sidecars(["a", "b", "c"], server.url) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.seconds < 0.5
            assert handover.successor.term == (handover.before.term or 0) + 1
            assert handover.leader.wait_exit(2.0) == 0
            logs = handover.leader.logs
            assert any(e.get("msg") == "stopped" and e.get("released") for e in logs)


async def test_a_stalled_server_demotes_the_leader_at_its_own_deadline_and_grants_no_one(
    server: RedisServer,
) -> None:
    """SIGSTOP the redis-server for two leases: the leader cannot renew and answers 503 at its
    own deadline (less than a lease after its last renewal), counting a demotion for the
    deadline; nobody else leads while the server is stalled (the store grants, never a TTL).
    After SIGCONT, leadership resumes or moves under a higher term, never with two leaders."""
    with sidecars(["a", "b", "c"], server.url) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            leader = by_name(procs, first.name)
            server.pause()
            paused_at = time.time()
            try:
                demoted = await observer.wait_for(
                    lambda s: s.name == first.name and not s.leader and s.sent >= paused_at,
                    timeout=LEASE + 1,
                )
                assert demoted.received < paused_at + LEASE + 0.2, (demoted, paused_at)
                deadline = await metric(leader, "leader_sidecar_demotions_total", reason="deadline")
                assert deadline == 1
                await asyncio.sleep(2 * LEASE)  # past every follower's observed expiry
            finally:
                server.resume()
            resumed_at = time.time()
            # While stalled: only the old reign, only before its deadline (less than a lease
            # after its last renewal, which was sent before the stall), and never again once
            # it was seen demoted.
            during = [s for s in observer.samples if s.leader and paused_at <= s.sent < resumed_at]
            assert all(
                s.identity == first.identity
                and s.since == first.since
                and s.sent < min(paused_at + LEASE, demoted.sent)
                for s in during
            ), during[-3:]
            again = await observer.leader(timeout=LEASE + RETRY + 3, after=resumed_at)
            assert again.term is not None
            assert first.term is not None
            assert again.term > first.term
    assert_fenced(observer)


async def test_a_restart_without_persistence_never_rewinds_the_term(server: RedisServer) -> None:
    """The server comes back empty (no RDB, no AOF): the lease and its counter are gone. The
    connected leader's watch sees the loss and renews at once, which puts its grant back with
    the same holder and term and raises the counter to it; the followers, which saw the store
    behind their terms, grant nothing meanwhile. The leader keeps leading without a break
    under its term, never two leaders, and the next hand-off takes the next term: the counter
    never goes back below a term that was granted."""
    with sidecars(["a", "b", "c"], server.url) as procs:
        async with LeaderObserver(procs) as observer:
            for _ in range(2):  # hand the lease around so the terms are not just 1
                current = await observer.leader(after=time.time())
                await release(by_name(procs, current.name))
                await observer.wait_for(
                    lambda s, c=current: s.leader and s.term is not None and s.term > c.term,
                    timeout=3,
                )
            before = max(s.term or 0 for s in observer.samples)
            assert before >= 3
            holder = await observer.leader(after=time.time())
            assert holder.term == before
            server.restart()
            restarted_at = time.time()
            wait_until(
                lambda: leader_on(server) == holder.identity, LEASE, "the grant was put back"
            )
            with server.client() as client:
                value = json.loads(client.get(HOLDER))
                assert (value["term"], value.get("restored")) == (before, True)
                assert int(client.get(TERM)) == before
            await asyncio.sleep(2 * LEASE)  # past the followers' wait for the loss
            kept = await observer.leader(after=time.time())
            assert (kept.identity, kept.term, kept.since) == (
                holder.identity,
                before,
                holder.since,
            ), "the leader stopped, or someone else took the lease"
            after_restart = [s for s in observer.samples if s.leader and s.sent >= restarted_at]
            assert {(s.identity, s.term, s.since) for s in after_restart} == {
                (holder.identity, before, holder.since)
            }
            handed_at = time.time()
            await release(by_name(procs, holder.name))
            successor = await observer.wait_for(
                lambda s: s.leader and s.sent >= handed_at and s.name != holder.name, timeout=3
            )
            assert successor.term == before + 1
            with server.client() as client:
                assert int(client.get(TERM)) == before + 1
            observer.assert_never_two_leaders()
    assert_fenced(observer)


async def test_the_password_comes_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    guarded = RedisServer.start(tmp_path / "p", password="s3cret horse")
    try:
        url = f"redis://127.0.0.1:{guarded.port}/0"
        with sidecars(["a"], url, env={"LEADER_SIDECAR_REDIS_PASSWORD": "s3cret horse"}) as procs:
            async with observing(procs) as observer:
                leader = await observer.leader()
                assert leader.name == "a"
            assert not any("s3cret" in line for line in procs[0].raw)
        in_url = f"redis://:s3cret%20horse@127.0.0.1:{guarded.port}/0"
        with sidecars(["b"], in_url) as procs:
            async with observing(procs) as observer:
                leader = await observer.leader()
                assert leader.name == "b"
            assert not any("s3cret" in line for line in procs[0].raw)
            assert any(f"redis://127.0.0.1:{guarded.port}/0" in line for line in procs[0].raw)
    finally:
        guarded.stop()


# -- TLS --------------------------------------------------------------------------------------


async def test_over_tls_the_right_ca_leads_and_a_wrong_ca_never_does_and_says_why(
    tmp_path: Path,
) -> None:
    good = TlsFiles.make(tmp_path, "good")
    wrong = TlsFiles.make(tmp_path, "wrong")
    (tmp_path / "tls").mkdir()
    tls_server = RedisServer.start(tmp_path / "tls", tls=good)
    try:
        trusting = SidecarProcess.start(
            "trusting", tls_server.url, args=["--redis-ca-file", str(good.ca_cert)]
        )
        misled = SidecarProcess.start(
            "misled", tls_server.url, args=["--redis-ca-file", str(wrong.ca_cert)]
        )
        procs = [trusting, misled]
        try:
            async with observing(procs) as observer:
                leader = await observer.leader()
                assert leader.name == "trusting"
                problem = misled.wait_log(lambda e: e.get("msg") == "redis unavailable", 5)
                assert problem["level"] == "error"
                assert "certificate failed verification" in problem["error"]
                assert str(wrong.ca_cert) in problem["error"]
                trusting.kill()
                await asyncio.sleep(2 * LEASE)
            assert not any(s.leader for s in observer.samples if s.name == "misled")
        finally:
            for proc in procs:
                proc.stop()
    finally:
        tls_server.stop()


# -- replicas and Sentinel --------------------------------------------------------------------


async def test_with_min_replicas_and_no_replica_no_one_leads_until_it_returns(
    tmp_path: Path, server: RedisServer
) -> None:
    """Fail closed: grants that no replica acknowledged do not count. When the replica comes
    back, a leader appears, with a term above the grants that did not count (every refused
    grant used up its term)."""
    (tmp_path / "replica").mkdir()
    replica = RedisServer.start(tmp_path / "replica")
    try:
        with sidecars(["a", "b", "c"], server.url, args=["--redis-min-replicas", "1"]) as procs:
            async with LeaderObserver(procs) as observer:
                started = time.time()
                await asyncio.sleep(3 * LEASE)
                assert not any(s.leader for s in observer.samples), "led without a replica"
                assert observer.count() > 100
                refusals = [
                    e["error"]
                    for p in procs
                    for e in p.logs
                    if e.get("msg") == "redis unavailable" and "only 0 of 1 replica" in e["error"]
                ]
                assert refusals
                assert all("the grant was withdrawn" in error for error in refusals), refusals
                with server.client() as client:
                    burned = int(client.get(TERM) or 0)
                assert burned >= 1
                replica.replicate(server)
                leader = await observer.leader(timeout=LEASE + 2 * RETRY + 3, after=started)
                assert leader.term is not None
                # The grant that counts may be one already in flight when we read the counter.
                assert leader.term >= burned
                observer.assert_never_two_leaders()
    finally:
        replica.stop()


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with sentinel_group(replicas=1) as started:
        yield started


def leader_on(server: RedisServer) -> str | None:
    with server.client() as client:
        value = client.get(HOLDER)
    return json.loads(value)["holder"] if value else None


async def test_sentinel_failover_with_min_replicas_keeps_one_leader_and_raises_the_term(
    group: SentinelGroup,
) -> None:
    """The old leader's renewals on the old master are acknowledged by no replica (the
    replica is the new master), so it demotes at its deadline; the sidecars follow the new
    master; once it has a replica again (the old master, converted by Sentinel ~10 s later),
    one of them leads there with a higher term. Never two leaders."""
    args = ["--redis-min-replicas", "1"]
    with sidecars(["a", "b", "c"], group.url(), args=args) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            old = group.failover()
            failed_over_at = time.time()
            new = group.wait_master_is_not(old)
            successor = await observer.wait_for(
                lambda s: s.leader and s.sent >= failed_over_at and (s.term or 0) > first.term,
                timeout=30,
            )
            assert successor.identity == leader_on(new)
            assert all(
                any(e.get("msg") == "redis sentinel switched master" for e in p.logs) for p in procs
            )
    assert_fenced(observer)


async def test_sentinel_failover_without_min_replicas_follows_the_new_master_at_once(
    group: SentinelGroup,
) -> None:
    """The sidecars hear +switch-master and lead on the new master within a few seconds,
    while the old master is still a master. Without WAIT a renewal made on the old master
    just before the switch can be lost; the switch bumps the epoch in every version the store
    reports, so the followers time the new master's record anew (a full lease) and a leader
    the new master no longer shows puts its grant back or reaches its deadline first. Never
    two leaders, and every new reign has a higher term."""
    lease = "2s"
    with sidecars(["a", "b", "c"], group.url(), lease_duration=lease) as procs:
        async with LeaderObserver(procs) as observer:
            first = await observer.leader()
            old = group.failover()
            new = group.wait_master_is_not(old)
            switched_at = time.time()

            def leads_on_new_master(sample: Sample) -> bool:
                return (
                    sample.leader
                    and sample.sent >= switched_at + 0.5
                    and (sample.identity == leader_on(new))
                )

            on_new = await observer.wait_for(leads_on_new_master, timeout=5)
            assert old.role() == "master", "the old master converted already: too slow"
            assert on_new.term is not None
            assert first.term is not None
            assert on_new.term >= first.term
            if on_new.identity != first.identity:
                assert on_new.term > first.term
    assert_fenced(observer)
    observer.assert_never_two_leaders()
