"""The verdict on one chaos run, from what the observer saw, what the fence accepted and what
the schedule did. Every judgment is checked on every run; none is relaxed for a fault kind.

1. two leaders at once: two identities' ``[since, last 200]`` intervals intersect (the
   observer's own test, `LeaderObserver.two_leaders_at_once`, on ``since`` translated back
   to the real clock for a replica whose wall clock the schedule stepped);
2. one term served (a 200 from the observer) or written (the fence log) by two identities;
3. a fenced write accepted below the term of an earlier accepted write;
4. a leader paused past its lease whose first answer after SIGCONT is not 503;
5. a replica that exited without the schedule killing or terminating it;
6. an interval without a leader longer than 2 x lease + 2 s after a fault healed.

The app-fault round (``RunFacts.apps`` given) adds:

7. the job off every up app for longer than ``job_bound`` while some slot's app was up: from
   the first fault on, every moment at which some app is up must be within ``job_bound`` of a
   moment at which a slot whose app is up leads (its reign, from ``since`` to its last 200,
   meets that app's up time). While every app is down nothing is asked; the bound starts
   again when one is back.

A sharded run is judged lease by lease (`judge_sharded`): judgments 1-4 and 6 on that lease's
samples and its own fenced row's log, exactly as for a single lease; 5 once for the run.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Sequence
from datetime import UTC, datetime

from tests.chaos.clock import ClockShift
from tests.chaos.cluster import lease_of
from tests.chaos.faults import FaultRecord
from tests.chaos.fence import FencedWrite
from tests.support.sidecars import LeaderObserver, Sample, SidecarProcess


@dataclasses.dataclass(frozen=True)
class Violation:
    judgment: str
    at: float  # wall clock
    detail: str


@dataclasses.dataclass
class RunFacts:
    store: str
    size: int
    seed: int
    lease: float
    started: float
    finished: float
    samples: list[Sample]
    fence_log: list[FencedWrite]
    records: list[FaultRecord]
    clocks: dict[str, ClockShift]  # slot name -> its wall-clock shift
    # Every process, whether the schedule ended it on purpose, and its exit status (None:
    # running) when the schedule finished.
    procs: list[tuple[SidecarProcess, bool, int | None]]
    # A sharded run: every shard's fenced log, by lease (``fence_log`` is then unused).
    fence_logs: dict[str, list[FencedWrite]] = dataclasses.field(default_factory=dict)
    shards: int = 0
    logs: str = ""  # where the run's sidecar logs are kept
    # The app-fault round: when each slot's app was up (slot name -> merged intervals), and
    # how soon the job must be back on an up app (judgment 7).
    apps: dict[str, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    job_bound: float = 0.0

    @property
    def leaderless_limit(self) -> float:
        return 2 * self.lease + 2.0


def stamp(facts: RunFacts, moment: float) -> str:
    wall = datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S.%f")[:-3]
    return f"t+{moment - facts.started:.3f}s ({wall}Z)"


def reign_windows(facts: RunFacts) -> dict[tuple[str, str, str], tuple[float, float]]:
    """For each reign (replica, identity, reported ``since``): the real-time window its start
    must lie in, from the observer's own clock: after the last answer of that replica that
    was not this reign, before the first answer that was."""
    by_name: dict[str, list[Sample]] = {}
    for sample in facts.samples:
        by_name.setdefault(sample.name, []).append(sample)
    windows: dict[tuple[str, str, str], tuple[float, float]] = {}
    for name, samples in by_name.items():
        samples.sort(key=lambda s: s.sent)
        previous_other = facts.started - 60.0
        for sample in samples:
            if not (sample.leader and sample.body and sample.identity):
                if sample.status is not None:
                    previous_other = sample.sent
                continue
            key = (name, sample.identity, str(sample.body["since"]))
            if key not in windows:
                windows[key] = (previous_other, sample.received)
    return windows


def real_since(
    facts: RunFacts, sample: Sample, windows: dict[tuple[str, str, str], tuple[float, float]]
) -> float:
    """``since`` on the real clock. A stepped replica reports its reign's start on its own
    wall clock: of the offsets its clock had, the one that puts the start inside the window
    the observer saw it begin in (steps are seconds to an hour; the window tens of ms)."""
    reported = sample.since
    clock = facts.clocks.get(sample.name)
    if clock is None or clock.offsets() == {0.0} or sample.body is None:
        return reported
    low, high = windows[(sample.name, str(sample.identity), str(sample.body["since"]))]
    for offset in sorted(clock.offsets(), key=abs):
        if low - 0.05 <= reported - offset <= high + 0.05:
            return reported - offset
    return reported  # no offset fits: judged as reported


def corrected(facts: RunFacts) -> list[Sample]:
    """The 200s, with ``since`` on the real clock."""
    windows = reign_windows(facts)
    result = []
    for sample in facts.samples:
        if not sample.leader or sample.body is None:
            continue
        since = real_since(facts, sample, windows)
        if since != sample.since:
            body = dict(sample.body)
            body["since"] = datetime.fromtimestamp(since, UTC).isoformat().replace("+00:00", "Z")
            sample = dataclasses.replace(sample, body=body)
        result.append(sample)
    return result


def describe(facts: RunFacts, sample: Sample) -> str:
    return (
        f"{sample.name}({sample.identity}) term {sample.term} "
        f"since {stamp(facts, sample.since)}, 200 sent {stamp(facts, sample.sent)}"
    )


KNOWN_LIMIT = "documented limit (a replica that had seen nothing): "


def answers_before(facts: RunFacts, sample: Sample) -> list[Sample]:
    """The follower answers this replica gave before this reign began."""
    return [
        s
        for s in facts.samples
        if s.identity == sample.identity and s.body and not s.leader and s.sent < sample.since
    ]


def had_seen_nothing(facts: RunFacts, sample: Sample) -> bool:
    """Every answer this replica gave before its reign showed no term at all: it never saw a
    grant (a follower reports the highest term it has seen, even once the store shows none)."""
    return all(not s.term for s in answers_before(facts, sample))


def seen_before(facts: RunFacts, sample: Sample) -> str:
    """What that replica had last reported as holder and term before this reign began: tells
    a grant by a replica that had seen the earlier grant from one that had seen nothing."""
    before = answers_before(facts, sample)
    if not before:
        return "no earlier answer from it"
    last = max(before, key=lambda s: s.sent)
    assert last.body is not None
    return (
        f"before, it last reported holder {last.body.get('holder')} term {last.term} "
        f"at {stamp(facts, last.sent)}"
    )


def two_leaders(facts: RunFacts, leaders: list[Sample]) -> list[Violation]:
    view = types.SimpleNamespace(samples=leaders)
    pairs = LeaderObserver.two_leaders_at_once(view)  # type: ignore[arg-type]
    return [
        Violation(
            "two leaders at once",
            max(a.since, b.since),
            f"{describe(facts, a)} AND {describe(facts, b)}",
        )
        for a, b in pairs
    ]


def restarts(facts: RunFacts, served: dict[int, dict[str, Sample]]) -> list[tuple[Sample, int]]:
    """Reigns where the store's terms started again (the README's limit), each with the
    highest term served before it: granted to a replica that had seen nothing, at a term below
    one already served."""
    reigns = [s for by_identity in served.values() for s in by_identity.values()]
    found = []
    for reign in reigns:
        before = [o.term for o in reigns if o.sent < reign.since]
        forgotten = max(before, default=0)  # type: ignore[type-var]
        if forgotten > reign.term and had_seen_nothing(facts, reign):  # type: ignore[operator]
            found.append((reign, forgotten))
    return found


def built_on_restart(facts: RunFacts, sample: Sample, restarted: list[tuple[Sample, int]]) -> bool:
    """A later reign on a sequence that started again: once a replica that had seen nothing
    granted term 1 again, grants by replicas that saw only the new sequence count 2, 3, ...
    again too (the README: "the term starts again at 1"). A replica that had seen the
    forgotten terms must still jump above them."""
    seen = max((s.term or 0 for s in answers_before(facts, sample)), default=0)
    return any(
        r.since <= sample.since and r.term <= sample.term and seen < forgotten  # type: ignore[operator]
        for r, forgotten in restarted
    )


def term_shared(facts: RunFacts, leaders: list[Sample]) -> list[Violation]:
    violations = []
    served: dict[int, dict[str, Sample]] = {}
    for sample in leaders:
        assert sample.term is not None
        assert sample.identity is not None
        served.setdefault(sample.term, {}).setdefault(sample.identity, sample)
    restarted = restarts(facts, served)
    for term, by_identity in served.items():
        if len(by_identity) > 1:
            firsts = sorted(by_identity.values(), key=lambda s: s.sent)
            blind = all(
                had_seen_nothing(facts, s) or built_on_restart(facts, s, restarted)
                for s in firsts[1:]
            )
            violations.append(
                Violation(
                    # README, "What it cannot close": a replica that started after the store
                    # lost everything cannot tell the loss from a new lease. Reported, and
                    # kept apart so that anything else still fails the run.
                    f"{KNOWN_LIMIT}one term served by two identities"
                    if blind
                    else "one term served by two identities",
                    firsts[1].sent,
                    f"term {term}: "
                    + "; ".join(f"{describe(facts, s)} ({seen_before(facts, s)})" for s in firsts),
                )
            )
    written: dict[int, dict[str, FencedWrite]] = {}
    for write in facts.fence_log:
        written.setdefault(write.term, {}).setdefault(write.identity, write)
    for term, by_writer in written.items():
        if len(by_writer) > 1:
            firsts = sorted(by_writer.values(), key=lambda w: w.time)
            violations.append(
                Violation(
                    "one term written by two identities",
                    firsts[1].time,
                    f"term {term}: "
                    + "; ".join(
                        f"{w.identity} seq {w.seq} at {stamp(facts, w.time)}" for w in firsts
                    ),
                )
            )
    return violations


def fence_regressed(facts: RunFacts) -> list[Violation]:
    violations = []
    highest: FencedWrite | None = None
    for write in facts.fence_log:
        if highest is not None and write.term < highest.term:
            violations.append(
                Violation(
                    "fenced write accepted below an earlier accepted term",
                    write.time,
                    f"{write.identity} term {write.term} seq {write.seq} accepted at "
                    f"{stamp(facts, write.time)} after {highest.identity} term {highest.term}",
                )
            )
        if highest is None or write.term > highest.term:
            highest = write
    return violations


def paused_leaders(facts: RunFacts) -> list[Violation]:
    violations = []
    for record in facts.records:
        paused = record.paused
        if paused is None:
            continue
        first = next(
            (
                s
                for s in facts.samples
                if s.name == paused.proc.name
                and s.received >= paused.resumed_at
                and s.sent >= paused.stopped_at - 1.0
                and (s.identity in (None, paused.identity))
            ),
            None,
        )
        if first is not None and first.status != 503:
            violations.append(
                Violation(
                    "a resumed paused leader's first answer is not 503",
                    first.received,
                    f"{paused.proc.name}({paused.identity}) stopped "
                    f"{stamp(facts, paused.stopped_at)}, resumed "
                    f"{stamp(facts, paused.resumed_at)}: first answer {first.status} "
                    f"term {first.term} received {stamp(facts, first.received)}",
                )
            )
    return violations


def exits(facts: RunFacts) -> list[Violation]:
    violations = []
    for proc, planned, code in facts.procs:
        if code is None or planned:
            continue
        seen = [s.received for s in facts.samples if s.name == proc.name and s.body]
        violations.append(
            Violation(
                "a replica exited by itself",
                max(seen, default=facts.finished),
                f"{proc.name}({proc.identity}) exit status {code}; last log lines:\n    "
                + "\n    ".join(proc.raw[-8:]),
            )
        )
    return violations


def coverage(leaders: list[Sample]) -> list[tuple[float, float]]:
    """Merged intervals during which some replica led: each reign from its ``since`` to its
    last 200's request."""
    reigns: dict[tuple[str | None, float], list[float]] = {}
    for sample in leaders:
        key = (sample.identity, sample.since)
        reign = reigns.setdefault(key, [sample.since, sample.sent])
        reign[1] = max(reign[1], sample.sent)
    merged: list[list[float]] = []
    for start, end in sorted(reigns.values()):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def leaderless(facts: RunFacts, leaders: list[Sample]) -> list[Violation]:
    covered = coverage(leaders)
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(covered)]
    if covered:
        gaps.append((covered[-1][1], facts.finished))
    violations = []
    for index, record in enumerate(facts.records):
        window_end = (
            facts.records[index + 1].began if index + 1 < len(facts.records) else facts.finished
        )
        for start, end in gaps:
            begin = max(start, record.healed)
            stop = min(end, window_end)
            if stop - begin > facts.leaderless_limit:
                violations.append(
                    Violation(
                        "no leader for longer than 2 x lease + 2s after a fault healed",
                        begin,
                        f"no leader from {stamp(facts, start)} to {stamp(facts, end)}; the fault "
                        f"healed at {stamp(facts, record.healed)}: {stop - begin:.2f}s > "
                        f"{facts.leaderless_limit:.2f}s",
                    )
                )
    return violations


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for low, high in sorted(intervals):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [(low, high) for low, high in merged]


def on_up_apps(facts: RunFacts, leaders: list[Sample]) -> list[tuple[float, float]]:
    """When a slot whose app was up led: each reign (``since`` to its last 200's request)
    cut to its slot's app's up time."""
    reigns: dict[tuple[str | None, float], tuple[str, float, float]] = {}
    for sample in leaders:
        key = (sample.identity, sample.since)
        _name, since, last = reigns.get(key, (sample.name, sample.since, sample.sent))
        reigns[key] = (sample.name, since, max(last, sample.sent))
    found = []
    for name, since, last in reigns.values():
        for low, high in facts.apps.get(name, []):
            if max(since, low) < min(last, high):
                found.append((max(since, low), min(last, high)))
    return merge(found)


def job_off_up_apps(facts: RunFacts, leaders: list[Sample]) -> list[Violation]:
    """Judgment 7: while some app is up, a slot whose app is up leads within ``job_bound``."""
    if not facts.apps:
        return []
    start = facts.records[0].began if facts.records else facts.finished
    done = on_up_apps(facts, leaders)
    some_up = merge([interval for ups in facts.apps.values() for interval in ups])
    violations = []
    for low, high in some_up:
        low, high = max(low, start), min(high, facts.finished)
        cursor = low
        gaps = []
        for begin, end in done:
            if end <= cursor:
                continue
            if begin >= high:
                break
            if begin > cursor:
                gaps.append((cursor, begin))
            cursor = max(cursor, end)
        if cursor < high:
            gaps.append((cursor, high))
        for begin, end in gaps:
            if end - begin > facts.job_bound:
                violations.append(
                    Violation(
                        f"the job off every up app for longer than {facts.job_bound:g}s",
                        begin,
                        f"from {stamp(facts, begin)} to {stamp(facts, end)} "
                        f"({end - begin:.2f}s) some app was up and no slot whose app was up "
                        f"led; {leading_at(facts, leaders, begin)}; apps up then: "
                        f"{apps_up_at(facts, begin + facts.job_bound) or 'none'}",
                    )
                )
    return violations


def leading_at(facts: RunFacts, leaders: list[Sample], moment: float) -> str:
    """Who the observer last saw lead at or before ``moment`` (for a failure message)."""
    before = [s for s in leaders if s.sent <= moment]
    if not before:
        return "no leader seen before"
    last = max(before, key=lambda s: s.sent)
    return f"last seen leading: {describe(facts, last)}"


def apps_up_at(facts: RunFacts, moment: float) -> list[str]:
    return [
        name for name, ups in facts.apps.items() if any(low <= moment < high for low, high in ups)
    ]


def grants_to_down_apps(facts: RunFacts, grace: float) -> list[str]:
    """Informational: reigns that began on a slot whose app had been down for ``grace`` (the
    check's reaction time and a margin) and still was: a sidecar should not campaign then,
    nor be handed the lease."""
    found = []
    firsts: dict[tuple[str | None, float], Sample] = {}
    for sample in corrected(facts):
        firsts.setdefault((sample.identity, sample.since), sample)
    for sample in firsts.values():
        ups = facts.apps.get(sample.name, [])
        since = sample.since
        if not any(low - 0.05 <= since < high + grace for low, high in ups):
            found.append(f"{sample.name}({sample.identity}) term {sample.term} at "
                         f"{stamp(facts, since)}")  # fmt: skip
    return found


def judge_lease(facts: RunFacts) -> list[Violation]:
    """Every judgment about one lease: its samples, its fenced log."""
    leaders = corrected(facts)
    return [
        *two_leaders(facts, leaders),
        *term_shared(facts, leaders),
        *fence_regressed(facts),
        *paused_leaders(facts),
        *leaderless(facts, leaders),
        *job_off_up_apps(facts, leaders),
    ]


def judge(facts: RunFacts) -> list[Violation]:
    found = [*judge_lease(facts), *exits(facts)]
    return sorted(found, key=lambda v: v.at)


def one_shard(facts: RunFacts, lease: str) -> RunFacts:
    """The run as seen by one lease: its samples (and every no-answer sample, which is about
    all of them) and its fenced row's log."""
    return dataclasses.replace(
        facts,
        samples=[s for s in facts.samples if lease_of(s) in (lease, None)],
        fence_log=facts.fence_logs.get(lease, []),
    )


def judge_sharded(facts: RunFacts, leases: Sequence[str]) -> list[Violation]:
    """`judge` lease by lease; each violation's detail names its lease."""
    found = exits(facts)
    for lease in leases:
        for violation in judge_lease(one_shard(facts, lease)):
            found.append(dataclasses.replace(violation, detail=f"[{lease}] {violation.detail}"))
    return sorted(found, key=lambda v: v.at)


def unled_after_settling(facts: RunFacts, leases: Sequence[str], since: float) -> list[Violation]:
    """Liveness once the faults are over: every lease led by some replica in the answers sent
    after ``since`` (a hand-over in flight at one instant is not a stuck shard; two leaders
    at once are the safety judgments' to find)."""
    led: set[str] = set()
    for sample in facts.samples:
        lease = lease_of(sample)
        if lease is not None and sample.sent >= since and sample.leader:
            led.add(lease)
    return [
        Violation(
            "a shard without a leader once the faults stopped and settled",
            facts.finished,
            f"[{lease}] no replica answered leader after {stamp(facts, since)}",
        )
        for lease in leases
        if lease not in led
    ]


def fault_at(records: Sequence[FaultRecord], moment: float) -> FaultRecord | None:
    """The fault in whose window (its start to the next one's) ``moment`` falls."""
    current = None
    for record in records:
        if record.began <= moment:
            current = record
    return current


def report(facts: RunFacts, violations: list[Violation]) -> str:
    """The failure message: seed, store, and per violation its fault, replicas and times."""
    run = f"n={facts.size}" + (f" x {facts.shards} shards" if facts.shards else "")
    selection = f"shards and {facts.store}" if facts.shards else f"{facts.store} and n{facts.size}"
    head = (
        f"chaos {facts.store} {run}: {len(violations)} violation(s); replay with "
        f"CHAOS_SEED={facts.seed} python3 -m pytest tests/chaos -k '{selection}'"
    )
    lines = [head, f"sidecar logs: {facts.logs}"] if facts.logs else [head]
    for violation in violations[:40]:
        record = fault_at(facts.records, violation.at)
        during = (
            f"during/after {record.spec.describe()} [{'; '.join(record.targets)}] began "
            f"{stamp(facts, record.began)} healed {stamp(facts, record.healed)}"
            if record
            else "before the first fault"
        )
        lines.append(
            f"- {violation.judgment} at {stamp(facts, violation.at)}, {during}:\n  "
            f"{violation.detail}"
        )
    if len(violations) > 40:
        lines.append(f"... and {len(violations) - 40} more")
    return "\n".join(lines)
