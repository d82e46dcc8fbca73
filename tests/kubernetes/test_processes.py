"""Three real ``leader-sidecar`` processes on the fake Kubernetes API server (its own process),
each in its own "pod" (``--pod-name``), every ``/leader`` polled every 10 ms for the whole
test: never two leaders at once, fast failover and hand-off, fail-closed under a stalled or
partitioned API, and the pods' role labels and Events after each change."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakekube import FakeKubeProcess, fake_kube_process
from tests.support.sidecars import (
    LeaderObserver,
    Sample,
    SidecarProcess,
    by_name,
    observing,
    signal_leader,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

NAMESPACE = "demo"
LEASE_NAME = "my-app"
LEASE = 2.0  # seconds; the renew interval is a third, the request timeout a sixth
KEY = "leader-sidecar/role"
NAMES = ("app-0", "app-1", "app-2")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeKubeProcess]:
    with fake_kube_process() as server:
        for name in NAMES:
            server.create_pod(NAMESPACE, name)
        yield server


def start(fake: FakeKubeProcess, tmp_path: Path, name: str) -> SidecarProcess:
    kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
    return SidecarProcess.start(
        name,
        "kubernetes",
        lease_duration=f"{LEASE:g}s",
        args=[
            "--lease",
            LEASE_NAME,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            str(kubeconfig),
            "--pod-name",
            name,
        ],
    )


@contextlib.contextmanager
def three_sidecars(fake: FakeKubeProcess, tmp_path: Path) -> Iterator[list[SidecarProcess]]:
    procs: list[SidecarProcess] = []
    try:
        for name in NAMES:
            procs.append(start(fake, tmp_path, name))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def role_labels(fake: FakeKubeProcess) -> dict[str, str | None]:
    return {name: fake.pod_labels(NAMESPACE, name).get(KEY) for name in NAMES}


def lease_events(fake: FakeKubeProcess) -> list[dict[str, Any]]:
    return fake.events(NAMESPACE, f"involvedObject.kind=Lease,involvedObject.name={LEASE_NAME}")


def wall(fake_monotonic: float) -> float:
    """The fake logs request times on CLOCK_MONOTONIC (shared by every process on the host)."""
    return fake_monotonic + (time.time() - time.monotonic())


def last_renewal_before(fake: FakeKubeProcess, moment: float) -> float:
    """Wall time at which the fake received the last successful lease write before
    ``moment``: the others could not see the lease expire before this plus a lease."""
    writes = [
        wall(r["t"])
        for r in fake.requests()
        if r["resource"] == "leases"
        and r["verb"] in ("patch", "update", "create")
        and r["status"] in (200, 201)
        and wall(r["t"]) <= moment
    ]
    return max(writes)


async def test_sigkill_of_the_leader_fails_over_within_the_lease_and_relabels_the_pods(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    """The old pod is relabelled follower by the new leader, since the killed sidecar could
    not; exactly one pod carries role=leader; each grant is an Event."""
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await eventually(lambda: role_labels(fake)[first.name] == "leader")
            handover = await signal_leader(observer, procs, signal.SIGKILL, within=LEASE + 3)
            assert handover.seconds <= LEASE + 0.5
            successor = handover.successor
            labels = await eventually(
                lambda: (
                    lambda found: (
                        found
                        if found[first.name] == "follower" and found[successor.name] == "leader"
                        else None
                    )
                )(role_labels(fake))
            )
            assert list(labels.values()).count("leader") == 1
            leaders = await asyncio.to_thread(fake.pods, NAMESPACE, f"{KEY}=leader")
            assert [pod["metadata"]["name"] for pod in leaders] == [successor.name]
            messages = [e["message"] for e in await asyncio.to_thread(lease_events, fake)]
            assert any(m.startswith(f"{first.identity} became leader") for m in messages)
            assert any(
                m.startswith(f"{successor.identity} became leader")
                and f"previous holder: {first.identity}" in m
                for m in messages
            )


async def test_sigterm_hands_off_well_under_a_second_through_the_watch(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    """Release on shutdown: the followers' watch sees the empty holder at once; the next
    grant is term + 1; the old pod is a follower and the Event says why."""
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await eventually(lambda: role_labels(fake)[first.name] == "leader")
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.seconds < 0.5, handover.seconds
            successor = handover.successor
            assert successor.term == (first.term or 0) + 1
            assert handover.leader.wait_exit(3.0) == 0
            await eventually(
                lambda: (
                    role_labels(fake)[first.name] == "follower"
                    and role_labels(fake)[successor.name] == "leader"
                )
            )
            messages = [e["message"] for e in await asyncio.to_thread(lease_events, fake)]
            assert (
                f"{first.identity} stopped leading (term {first.term}): released on shutdown"
                in (messages)
            )


async def assert_fails_closed(
    fake: FakeKubeProcess, observer: LeaderObserver, first: Sample, cut_at: float
) -> None:
    """The old leader answers 503 before anyone else could have seen its lease expire, and
    keeps answering 503 while the API is unusable."""
    last_write = last_renewal_before(fake, cut_at)
    first_503 = await observer.wait_for(
        lambda s: s.name == first.name and s.status == 503 and s.sent >= cut_at,
        timeout=LEASE + 2,
    )
    late_200s = [
        s
        for s in observer.samples
        if s.name == first.name and s.leader and s.received > last_write + LEASE
    ]
    assert not late_200s, late_200s[:3]
    assert first_503.received <= last_write + LEASE


async def test_a_stalled_api_makes_the_leader_answer_503_before_its_lease_could_expire(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await asyncio.sleep(LEASE / 2)  # a few renewals
            await asyncio.to_thread(fake.set_faults, latency=30)
            stalled_at = time.time()
            await assert_fails_closed(fake, observer, first, stalled_at)
            await asyncio.to_thread(fake.clear_faults)
            recovered = await observer.leader(timeout=LEASE * 3 + 5, after=time.time())
            assert recovered.term is not None
            assert first.term is not None
            assert recovered.term > first.term


async def test_a_partitioned_leader_answers_503_before_its_lease_could_expire(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await asyncio.sleep(LEASE / 2)
            await asyncio.to_thread(fake.partition)
            cut_at = time.time()
            await assert_fails_closed(fake, observer, first, cut_at)
            await asyncio.sleep(LEASE)
            assert all(proc.proc.poll() is None for proc in procs)
            await asyncio.to_thread(fake.heal)
            recovered = await observer.leader(timeout=LEASE * 3 + 5, after=time.time())
            assert recovered.term is not None
            assert first.term is not None
            assert recovered.term > first.term


async def test_deleting_the_lease_while_leading_puts_it_back_and_never_gives_its_term_away(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    """Everyone saw term T through the watch. A deleted Lease is a store that lost the
    leader's grant, not a free lease: the leader's watch shows it gone, it renews at once and
    the renewal re-creates the Lease with its own name and term T (rule 5); the followers,
    which saw the store lose state, grant nothing meanwhile (rule 8). The leader keeps leading
    without a break under T, never two leaders, and the next hand-off takes T + 1."""
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            assert first.term is not None
            for proc in procs:  # every replica has seen the term (a replica that never saw
                # it cannot know it: see docs/kubernetes.md, "Deleting the Lease")
                await observer.wait_for(
                    lambda s, name=proc.name: (
                        s.name == name
                        and s.body is not None
                        and s.body["holder"] == first.identity
                        and s.term == first.term
                    ),
                    timeout=5,
                )
            deleted_at = time.time()
            assert await asyncio.to_thread(fake.delete_lease, NAMESPACE, LEASE_NAME) == 200

            def restored() -> bool:
                spec = (fake.lease(NAMESPACE, LEASE_NAME) or {}).get("spec") or {}
                return (spec.get("holderIdentity"), spec.get("leaseTransitions")) == (
                    first.identity,
                    first.term,
                )

            await eventually(restored, timeout=LEASE / 3 + 1.0)  # at once, or the next renewal
            leader = by_name(procs, first.name)
            assert any("putting it back" in str(e.get("msg")) for e in leader.logs)
            await asyncio.sleep(LEASE + 0.5)  # past the followers' wait for the loss
            kept = await observer.leader(after=time.time())
            assert (kept.identity, kept.term, kept.since) == (
                first.identity,
                first.term,
                first.since,
            ), "the leader stopped, or someone else took the lease"
            since_delete = {
                (s.identity, s.term, s.since)
                for s in observer.samples
                if s.leader and s.sent >= deleted_at
            }
            assert since_delete == {(first.identity, first.term, first.since)}
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.successor.term == first.term + 1
            assert all(proc.proc.poll() is None for proc in procs if proc is not leader)


async def test_a_storm_of_409s_neither_crashes_anyone_nor_grants_twice(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    """Every other write lost to a racing writer, then every write lost: nobody crashes,
    nobody is granted a lease someone else holds, the leader fails closed at its deadline
    while it cannot renew; afterwards there is one leader again, on a higher term."""
    writes = {"resources": ["leases"], "verbs": ["create", "update", "patch"]}
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await asyncio.to_thread(
                fake.set_faults, errors=[{"status": 409, "every": 2, "match": writes}]
            )
            half_storm_at = time.time()
            await asyncio.sleep(3 * LEASE)
            requests = await asyncio.to_thread(fake.requests)
            assert len([r for r in requests if r["status"] == 409]) >= 3
            assert all(proc.proc.poll() is None for proc in procs)
            # A lost race on a renewal is retried at once (the store re-read a Lease that is
            # still ours), so every other write failing costs the leader nothing.
            during = [s for s in observer.samples if s.sent > half_storm_at and s.status]
            assert {(s.identity, s.term) for s in during if s.leader} == {
                (first.identity, first.term)
            }
            assert all(s.leader for s in during if s.name == first.name)

            await asyncio.to_thread(fake.set_faults, errors=[{"status": 409, "match": writes}])
            storm_at = time.time()
            await asyncio.sleep(2 * LEASE)
            answers = [s for s in observer.samples if s.sent > storm_at]
            assert not [s for s in answers if s.leader and s.received > storm_at + LEASE]
            assert not [s for s in answers if s.leader and s.since > storm_at]  # no new grant
            terms = [s.term for s in observer.samples if s.term is not None and s.sent < storm_at]
            assert all(proc.proc.poll() is None for proc in procs)

            await asyncio.to_thread(fake.clear_faults)
            settled = await observer.leader(timeout=LEASE * 3 + 5, after=time.time())
            assert settled.term is not None
            assert settled.term > max(terms)


async def test_after_a_dropped_watch_the_hand_off_is_still_fast(
    fake: FakeKubeProcess, tmp_path: Path
) -> None:
    with three_sidecars(fake, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await asyncio.sleep(0.5)

            def of_the_lease(verb: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
                """Not the candidates Lease, which each sidecar lists and watches too."""
                return [
                    r for r in requests if r["verb"] == verb and "-candidates" not in r["query"]
                ]

            watches = len(of_the_lease("watch", await asyncio.to_thread(fake.requests)))
            # Every sidecar's lease watch, and the leader's watch of the candidates Lease.
            assert await asyncio.to_thread(fake.drop_watches) == 4
            await eventually(lambda: len(of_the_lease("watch", fake.requests())) >= watches + 3)
            stopped_at = time.time()
            by_name(procs, first.name).terminate()
            successor = await observer.wait_for(
                lambda s: s.leader and s.name != first.name and s.sent >= stopped_at, timeout=3
            )
            assert successor.since - stopped_at < 0.5
            lists = of_the_lease("list", await asyncio.to_thread(fake.requests))
            # Each listed once at start and once after its watch broke (a broken connection may
            # be a restarted API server: list again, never resume blindly).
            assert len(lists) == 6
