"""Three real sidecar processes on one SQLite file, watched every 10 ms for the whole test."""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.chaos.clock import ClockShift, build_shim
from tests.support.sidecars import (
    LeaderObserver,
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


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leases.db'}"


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


async def test_a_wall_clock_stepping_while_a_replica_starts_neither_stalls_it_nor_frees_the_lease(
    tmp_path: Path,
) -> None:
    """A host whose clock NTP steps at boot starts its sidecar exactly then. The jumper's wall
    clock steps an hour ahead, an hour back and back again every 40 ms, from before its
    process starts until leases after it answers (the chaos suite's clockshift shim: a real
    CLOCK_REALTIME step, monotonic clocks untouched). It answers every request promptly,
    never leads, and names the leader; the leader keeps its term (rule 2: expiry is observed
    on monotonic clocks, no wall clock is read for any decision)."""
    store = store_url(tmp_path)
    clock = ClockShift(build_shim(tmp_path), tmp_path / "jumper-clock")
    stop = threading.Event()

    def step_on() -> None:
        for offset in itertools.cycle((3600.0, -3600.0, 0.0)):
            if stop.wait(0.04):
                return
            clock.step(offset)

    with sidecars(["leader"], store) as procs:
        async with LeaderObserver(procs) as observer:
            first = await observer.leader()
            stepper = threading.Thread(target=step_on, daemon=True)
            stepper.start()
            try:
                jumper = SidecarProcess.start("jumper", store, env=clock.env)
                procs.append(jumper)
                observer.watch(jumper)
                listening = time.time()
                await observer.wait_for(lambda s: s.sent > listening + 4 * LEASE, timeout=15)
            finally:
                stop.set()
                stepper.join()
            assert len(clock.offsets()) == 3, "the clock never stepped"
            answers = [s for s in observer.samples if s.name == "jumper"]
            assert len(answers) > 20, answers
            # Every request answered within a lease (the CI run under libfaketime saw 3 s of
            # silence; the shim shows that was libfaketime's cost, not the sidecar's).
            slow = [s for s in answers if s.status is None or s.received - s.sent > LEASE]
            assert not slow, (slow[:3], jumper.raw[-15:])
            assert not any(s.leader for s in answers)
            named = [s for s in answers if s.body and s.body["holder"] == first.identity]
            assert named, (answers[:5], jumper.raw[-15:])
            assert named[0].sent < listening + LEASE, (answers[:5], jumper.raw[-15:])
            assert all(s.body and s.body["holder"] == first.identity for s in answers[-5:])
            leader_answers = [
                s for s in observer.samples if s.name == "leader" and s.sent >= first.sent
            ]
            bad = [s for s in leader_answers if not (s.leader and s.term == first.term)]
            assert not bad, (bad[:3], procs[0].raw[-30:])
            observer.assert_never_two_leaders()
