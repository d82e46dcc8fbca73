"""Three real sidecar processes on one SQLite file, watched every 10 ms for the whole test."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.sidecars import (
    LeaderObserver,
    SidecarProcess,
    by_name,
    observing,
    sidecars,
    signal_leader,
)
from tests.support.tools import find_binary

pytestmark = pytest.mark.slow

LEASE = 1.0
RENEW = LEASE / 3
RETRY = min(2.0, RENEW)  # the default retry period for this lease


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leases.db'}"


def libfaketime() -> str | None:
    candidates = Path("/usr/lib").glob("*/faketime/libfaketime.so.1")
    return next((str(path) for path in candidates), None)


async def test_sigkill_of_the_leader_fails_over_to_a_higher_term_within_the_lease(
    tmp_path: Path,
) -> None:
    """The dead leader's last version stays unchanged; a follower that has seen it so for a
    lease on its own clock takes it with the next term."""
    with sidecars(["a", "b", "c"], store_url(tmp_path)) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(
                observer, procs, signal.SIGKILL, within=LEASE + RETRY + 0.5 + 2.0
            )
            assert handover.seconds <= LEASE + RETRY + 0.5
            # Everyone else now agrees on the holder and term.
            successor = handover.successor
            for proc in procs:
                if proc.name not in (handover.before.name, successor.name):
                    follower = await observer.wait_for(
                        lambda s, n=proc.name: (
                            s.name == n
                            and s.body is not None
                            and s.body["holder"] == successor.identity
                        ),
                        timeout=3,
                    )
                    assert follower.status == 503
                    assert follower.term == successor.term


async def test_sigterm_of_the_leader_hands_off_within_a_second(tmp_path: Path) -> None:
    """Release on shutdown: a follower leads within one second, not one lease; exit 0."""
    with sidecars(["a", "b", "c"], store_url(tmp_path)) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.seconds < 1.0
            assert handover.successor.term == (handover.before.term or 0) + 1
            assert handover.leader.wait_exit(2.0) == 0
            assert time.time() - handover.began < 2.5
            logs = handover.leader.logs
            assert any(e.get("msg") == "stopped" and e.get("released") for e in logs)


async def test_a_paused_leader_answers_503_first_thing_after_resuming(tmp_path: Path) -> None:
    """SIGSTOP for two leases: another replica leads meanwhile; on SIGCONT the old leader's
    first answer is 503, before its election loop has run (rule 4)."""
    with sidecars(["a", "b", "c"], store_url(tmp_path)) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            leader = by_name(procs, first.name)
            leader.pause()
            paused_at = time.time()
            successor = await observer.wait_for(
                lambda s: s.leader and s.name != first.name and s.sent >= paused_at,
                timeout=2 * LEASE + 2,
            )
            # Keep it paused for two full leases (a deliberate pause, not a hopeful wait).
            await asyncio.sleep(max(0.0, paused_at + 2 * LEASE - time.time()))
            resumed_at = time.time()
            leader.resume()
            answer = await observer.wait_for(
                lambda s: s.name == first.name and s.received >= resumed_at, timeout=5
            )
            assert answer.status == 503, answer
            assert successor.term is not None
            assert first.term is not None
            assert successor.term > first.term


async def test_a_restarted_leader_waits_for_its_old_lease_and_takes_a_new_term(
    tmp_path: Path,
) -> None:
    """Same pod name, new process: no inheritance of the predecessor's grant (rule 6). It
    has never seen the old record before, so it times it from its own first sight, after the
    kill: a full lease (rule 2)."""
    store = store_url(tmp_path)
    with sidecars(["app-0"], store) as procs:
        async with LeaderObserver(procs) as observer:
            first = await observer.leader()
            procs[0].kill()
            killed_at = time.time()
            restarted = SidecarProcess.start("app-0", store)
            procs.append(restarted)
            observer.watch(restarted)
            assert restarted.identity != first.identity
            second = await observer.wait_for(
                lambda s: s.leader and s.name == "app-0" and s.identity == restarted.identity,
                timeout=5,
            )
            observer.assert_never_two_leaders()
    assert second.term is not None
    assert first.term is not None
    assert second.term == first.term + 1
    # Timed from the new process's first sight of the old record, which is after the kill
    # (10 ms: `since` is rounded to the millisecond).
    assert second.since - killed_at >= LEASE - 0.01


async def test_a_wall_clock_jump_on_one_replica_does_not_expire_the_leaders_lease(
    tmp_path: Path,
) -> None:
    """Expiry is observed on the follower's own monotonic clock, never read from a wall
    clock: a follower whose wall clock jumps an hour ahead still sees the leader's lease as
    live (rule 2)."""
    library = libfaketime()
    if library is None:
        if find_binary("faketime") is None and not os.environ.get("CI"):
            pytest.skip("libfaketime is not installed; run scripts/setup-test-env")
        pytest.fail("libfaketime.so.1 not found")
    store = store_url(tmp_path)
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    with sidecars(["leader"], store) as procs:
        async with LeaderObserver(procs) as observer:
            first = await observer.leader()
            jumper = SidecarProcess.start(
                "jumper",
                store,
                env={
                    "LD_PRELOAD": library,
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_TIMESTAMP_FILE": str(offset),
                    "FAKETIME_NO_CACHE": "1",
                },
            )
            procs.append(jumper)
            observer.watch(jumper)
            # A running follower's clock jumps: once it has seen the lease. (A jump during its
            # start-up once left its /leader unanswered under CI load; see the closing note of
            # 2026-12-02.)
            await observer.wait_for(
                lambda s: (
                    s.name == "jumper" and s.body is not None and s.body["holder"] == first.identity
                ),
                timeout=10,
            )
            offset.write_text("+3600\n")
            jumped_at = time.time()
            # Several leases pass with the jumper's wall clock an hour ahead.
            await observer.wait_for(lambda s: s.sent > jumped_at + 3 * LEASE, timeout=10)
            jumper_answers = [s for s in observer.samples if s.name == "jumper" and s.body]
            assert jumper_answers, "the jumper never answered"
            assert not any(s.leader for s in jumper_answers)
            last = jumper_answers[-5:]
            assert all(s.body and s.body["holder"] == first.identity for s in last), (
                [(round(s.sent - jumped_at, 3), s.body) for s in last],
                jumper.raw[-15:],
            )
            leader_answers = [
                s for s in observer.samples if s.name == "leader" and s.sent >= first.sent
            ]
            bad = [s for s in leader_answers if not (s.leader and s.term == first.term)]
            assert not bad, (bad[:3], procs[0].raw[-30:])
            observer.assert_never_two_leaders()
