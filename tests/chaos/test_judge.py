"""The judge on made-up observations: each judgment fires on the case it exists for and stays
quiet on correct behaviour (milliseconds, no processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.apps import AppMode
from tests.chaos.clock import ClockShift, build_shim
from tests.chaos.faults import FaultRecord, Paused
from tests.chaos.fence import FencedWrite
from tests.chaos.judge import KNOWN_LIMIT, RunFacts, judge, judge_sharded, unled_after_settling
from tests.chaos.schedule import FaultSpec, app_fault_count, draw
from tests.support.sidecars import Sample, SidecarProcess

T0 = 1_800_000_000.0
LEASE = 1.0


def iso(moment: float) -> str:
    return (
        datetime.fromtimestamp(moment, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def answer(name: str, at: float, identity: str, term: int, since: float | None) -> Sample:
    body: dict[str, Any] = {
        "leader": since is not None,
        "identity": identity,
        "term": term,
        "since": iso(since) if since is not None else iso(T0),
    }
    return Sample(name, at, at + 0.002, 200 if since is not None else 503, body)


def reign(name: str, identity: str, term: int, start: float, end: float) -> list[Sample]:
    """A 503 just before ``start``, then a 200 every 10 ms until ``end``."""
    samples = [answer(name, start - 0.01, identity, term - 1, None)]
    moment = start + 0.005
    while moment <= end:
        samples.append(answer(name, moment, identity, term, start))
        moment += 0.01
    return samples


def spec(kind: str = "sigkill") -> FaultSpec:
    return FaultSpec(1, kind, "leader", 0.0, 2.0, 0.0, 0.3, 0.5)


def facts(
    samples: list[Sample],
    *,
    fence: list[FencedWrite] | None = None,
    records: list[FaultRecord] | None = None,
    clocks: dict[str, ClockShift] | None = None,
    procs: list[tuple[SidecarProcess, bool, int | None]] | None = None,
    finished: float | None = None,
) -> RunFacts:
    last = max(s.received for s in samples)
    return RunFacts(
        store="test",
        size=3,
        seed=7,
        lease=LEASE,
        started=T0,
        finished=finished if finished is not None else last,
        samples=sorted(samples, key=lambda s: s.received),
        fence_log=fence or [],
        records=records or [FaultRecord(spec(), began=T0 + 0.5, healed=T0 + 0.6)],
        clocks=clocks or {},
        procs=procs or [],
    )


def judgments(run: RunFacts) -> list[str]:
    return [violation.judgment for violation in judge(run)]


def test_a_clean_hand_over_is_no_violation() -> None:
    samples = reign("s0", "a_1", 1, T0, T0 + 2) + reign("s1", "b_1", 2, T0 + 2.5, T0 + 5)
    fence = [FencedWrite("a_1", 1, 1, T0 + 1), FencedWrite("b_1", 2, 1, T0 + 3)]
    assert judgments(facts(samples, fence=fence)) == []


def test_overlapping_reigns_are_two_leaders() -> None:
    samples = reign("s0", "a_1", 1, T0, T0 + 2) + reign("s1", "b_1", 2, T0 + 1.5, T0 + 4)
    assert "two leaders at once" in judgments(facts(samples))


def test_one_term_for_two_identities_served_and_written() -> None:
    samples = reign("s0", "a_1", 3, T0, T0 + 1) + reign("s1", "b_1", 3, T0 + 2, T0 + 3)
    fence = [FencedWrite("a_1", 3, 1, T0 + 0.5), FencedWrite("b_1", 3, 1, T0 + 2.5)]
    found = judgments(facts(samples, fence=fence))
    assert "one term served by two identities" in found
    assert "one term written by two identities" in found


def test_a_term_repeated_by_a_replica_that_had_seen_nothing_is_the_documented_limit() -> None:
    """The README's limit: a replica started after the store lost everything cannot tell the
    loss from a new lease. Reported apart; a replica that had seen a term is a violation."""
    blind = reign("s0", "a_1", 1, T0, T0 + 1) + reign("s1", "b_1", 1, T0 + 2, T0 + 3)
    assert judgments(facts(blind)) == [f"{KNOWN_LIMIT}one term served by two identities"]
    seen = [answer("s1", T0 + 1.5, "b_1", 9, None)]  # b had seen term 9, then served 1
    found = judgments(facts(blind + seen))
    assert found == ["one term served by two identities"]


def test_terms_counted_again_after_a_blind_restart_are_the_documented_limit() -> None:
    """After a replica that had seen nothing granted term 1 again, a replica that saw only the
    new sequence counts 2 again: the limit's consequence ("the term starts again at 1"). One
    that had seen the forgotten term 2 must jump above it, or the run fails."""
    before_loss = reign("s0", "a_1", 1, T0, T0 + 1) + reign("s1", "b_1", 2, T0 + 1.2, T0 + 2)
    blind = reign("s2", "c_1", 1, T0 + 3, T0 + 4)
    counted_again = reign("s3", "d_1", 2, T0 + 5, T0 + 6)  # its 503 before showed term 1
    found = judgments(facts(before_loss + blind + counted_again))
    assert found == [f"{KNOWN_LIMIT}one term served by two identities"] * 2
    had_seen_2 = [answer("s3", T0 + 1.5, "d_1", 2, None)]
    found = judgments(facts(before_loss + blind + counted_again + had_seen_2))
    assert found == [
        f"{KNOWN_LIMIT}one term served by two identities",
        "one term served by two identities",
    ]


def test_a_write_below_an_earlier_term_is_a_regression() -> None:
    samples = reign("s0", "a_1", 1, T0, T0 + 3)
    fence = [FencedWrite("b_1", 5, 1, T0 + 1), FencedWrite("a_1", 4, 2, T0 + 2)]
    assert "fenced write accepted below an earlier accepted term" in judgments(
        facts(samples, fence=fence)
    )


def test_a_long_gap_after_a_heal_is_too_long_without_a_leader() -> None:
    samples = reign("s0", "a_1", 1, T0, T0 + 1) + reign("s1", "b_1", 2, T0 + 5.5, T0 + 6)
    record = FaultRecord(spec(), began=T0 + 0.9, healed=T0 + 1.0)
    assert judgments(facts(samples, records=[record])) == [
        "no leader for longer than 2 x lease + 2s after a fault healed"
    ]
    quick = reign("s0", "a_1", 1, T0, T0 + 1) + reign("s1", "b_1", 2, T0 + 4.5, T0 + 6)
    assert judgments(facts(quick, records=[record])) == []


def test_a_paused_leaders_first_answer_must_be_503(tmp_path: Path) -> None:
    proc = SidecarProcess.__new__(SidecarProcess)
    proc.name = "s0"
    samples = reign("s0", "a_1", 1, T0, T0 + 1) + reign("s1", "b_1", 2, T0 + 2.2, T0 + 4)
    late = answer("s0", T0 + 1.0, "a_1", 1, T0)  # sent before the pause, answered after
    samples.append(Sample("s0", late.sent, T0 + 3.01, 200, late.body))
    record = FaultRecord(
        spec("sigstop"),
        began=T0 + 1.0,
        healed=T0 + 3.0,
        paused=Paused(proc, "a_1", T0 + 1.0, T0 + 3.0),
    )
    assert "a resumed paused leader's first answer is not 503" in judgments(
        facts(samples, records=[record])
    )


def test_an_unplanned_exit_is_reported_and_a_planned_one_is_not() -> None:
    proc = SidecarProcess.__new__(SidecarProcess)
    proc.name, proc.identity, proc.raw = "s2", "c_1", ["boom"]
    samples = reign("s0", "a_1", 1, T0, T0 + 3)
    assert judgments(facts(samples, procs=[(proc, False, 1)])) == ["a replica exited by itself"]
    assert judgments(facts(samples, procs=[(proc, True, -9)])) == []


def test_since_from_a_stepped_clock_is_translated_back(tmp_path: Path) -> None:
    """A replica whose wall clock is an hour behind reports ``since`` an hour early: taken as
    is, it would overlap the previous leader's reign."""
    clock = ClockShift(tmp_path / "unused.so", tmp_path / "offset")
    clock.history = [(0.0, 0.0), (T0 + 0.5, -3600.0)]
    first = reign("s0", "a_1", 1, T0, T0 + 2)
    second = [
        Sample(s.name, s.sent, s.received, s.status, {**s.body, "since": iso(T0 + 2.5 - 3600)})
        if s.status == 200 and s.body
        else s
        for s in reign("s1", "b_1", 2, T0 + 2.5, T0 + 4)
    ]
    run = facts(first + second, clocks={"s1": clock})
    assert judgments(run) == []
    unshifted = facts(first + second)  # without the translation: a false two-leaders
    assert "two leaders at once" in judgments(unshifted)


def test_the_schedule_is_a_function_of_the_seed() -> None:
    kinds = ("sigkill", "sigstop", "store_stall")
    one = draw(42, "redis", kinds, 7, LEASE)
    assert one == draw(42, "redis", kinds, 7, LEASE)
    assert one != draw(43, "redis", kinds, 7, LEASE)
    assert {s.kind for s in one[:3]} == set(kinds)  # every kind before any repeats


def test_the_shim_steps_the_wall_clock_only(tmp_path: Path) -> None:
    clock = ClockShift(build_shim(tmp_path), tmp_path / "offset")
    clock.step(3600.0)
    script = (
        "import time; w=time.time(); m=time.monotonic(); time.sleep(0.01); "
        "print(w, m, time.time() - w)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **clock.env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert abs(float(out[0]) - time.time() - 3600) < 5
    assert abs(float(out[1]) - time.monotonic()) < 5
    assert 0.005 < float(out[2]) < 1.0


def on_lease(samples: list[Sample], lease: str) -> list[Sample]:
    """The samples as a `/leases` observer records them: each about one lease."""
    return [
        Sample(s.name, s.sent, s.received, s.status, {**(s.body or {}), "lease": lease})
        for s in samples
    ]


def test_sharded_runs_are_judged_lease_by_lease() -> None:
    """Two replicas leading two different shards at once is no violation; two leading one
    shard is, named by its lease; a write below an earlier term counts only within its row."""
    samples = [
        *on_lease(reign("a", "a_1", 1, T0, T0 + 2.0), "jobs-0"),
        *on_lease(reign("b", "b_1", 1, T0, T0 + 2.0), "jobs-1"),
        *on_lease(reign("c", "c_1", 2, T0 + 1.0, T0 + 2.0), "jobs-1"),
    ]
    run = facts(samples)
    run.fence_logs = {
        "jobs-0": [FencedWrite("a_1", 1, 1, T0 + 0.1)],
        "jobs-1": [FencedWrite("b_1", 1, 1, T0 + 0.1), FencedWrite("c_1", 2, 1, T0 + 1.1)],
    }
    found = judge_sharded(run, ["jobs-0", "jobs-1"])
    assert [(v.judgment, v.detail.split("]")[0]) for v in found] == [
        ("two leaders at once", "[jobs-1")
    ]
    run.fence_logs["jobs-1"].append(FencedWrite("b_1", 1, 2, T0 + 1.2))
    found = judge_sharded(run, ["jobs-0", "jobs-1"])
    assert any(v.judgment.startswith("fenced write accepted below") for v in found)


def test_a_shard_without_a_leader_after_settling_is_a_violation() -> None:
    """Liveness at the end of a sharded run: every shard led in some answer after settling."""
    samples = [
        *on_lease(reign("a", "a_1", 1, T0, T0 + 2.0), "jobs-0"),
        *on_lease([answer("a", T0 + 1.99, "a_1", 1, None)], "jobs-1"),
    ]
    run = facts(samples)
    assert not unled_after_settling(run, ["jobs-0"], T0 + 1.5)
    (violation,) = unled_after_settling(run, ["jobs-0", "jobs-1"], T0 + 1.5)
    assert violation.detail.startswith("[jobs-1] no replica answered leader")


def app_facts(samples: list[Sample], apps: dict[str, list[tuple[float, float]]]) -> RunFacts:
    run = facts(samples, records=[FaultRecord(spec("app_kill"), began=T0 + 0.5, healed=T0 + 3)])
    run.apps, run.job_bound = apps, 2.0
    return run


def test_the_job_left_on_a_down_app_while_another_is_up_is_a_violation() -> None:
    """s0's app dies at +1; s1's is up throughout. A hand-over at +1.5 is in time, at +3.5
    is not; with every app down (s1's too) until +3, keeping the lease is no violation, and
    the bound runs from when s1's app is back."""
    samples = reign("s0", "a_1", 1, T0, T0 + 1.5) + reign("s1", "b_1", 2, T0 + 1.52, T0 + 6)
    up = {"s0": [(T0 - 1, T0 + 1)], "s1": [(T0 - 1, T0 + 7)]}
    assert judgments(app_facts(samples, up)) == []
    late = reign("s0", "a_1", 1, T0, T0 + 3.5) + reign("s1", "b_1", 2, T0 + 3.52, T0 + 6)
    assert judgments(app_facts(late, up)) == ["the job off every up app for longer than 2s"]
    all_down = {"s0": [(T0 - 1, T0 + 1)], "s1": [(T0 - 1, T0 + 0.8), (T0 + 3.0, T0 + 7)]}
    assert judgments(app_facts(late, all_down)) == []
    still = reign("s0", "a_1", 1, T0, T0 + 5.5) + reign("s1", "b_1", 2, T0 + 5.52, T0 + 6)
    assert judgments(app_facts(still, all_down)) == ["the job off every up app for longer than 2s"]


def test_an_app_flapping_under_the_bound_keeps_the_job() -> None:
    """The leader's app down for 0.15 s in every 0.4 s and nobody else's up: no violation
    (the job is back on an up app at every up spell); the flap formula matches the app's."""
    mode = AppMode("flap", T0 + 1, 0.15, 0.25)
    ups = [(T0 - 1, T0 + 1), *mode.up_within(T0 + 1, T0 + 4), (T0 + 4, T0 + 6)]
    assert all(mode.up_at(low + 0.001) and not mode.up_at(low - 0.001) for low, _ in ups[1:4])
    samples = reign("s0", "a_1", 1, T0, T0 + 6)
    assert judgments(app_facts(samples, {"s0": ups, "s1": []})) == []


def test_app_fault_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short mode every app kind twice; long mode a quarter of CHAOS_FAULTS; or its own."""
    monkeypatch.delenv("CHAOS_FAULTS", raising=False)
    monkeypatch.delenv("CHAOS_APP_FAULTS", raising=False)
    assert app_fault_count() == 8
    monkeypatch.setenv("CHAOS_FAULTS", "300")
    assert app_fault_count() == 75
    monkeypatch.setenv("CHAOS_APP_FAULTS", "12")
    assert app_fault_count() == 12
