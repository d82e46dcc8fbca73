"""The chaos suite: N real sidecars per store (3 and 5), a fenced writer beside each, an
observer on every ``/leader``, and a seeded schedule of faults; judged by `judge.judge`. And
per store a sharded run: 5 sidecars sharing 16 leases, judged shard by shard. And per store an
app-fault round: 3 sidecars each checking an app of its own, the apps killed, hung, flapping
and all down, judged also on the job being back on an up app within `JOB_BOUND`.

Short mode (CI): ``CHAOS_FAULTS`` faults per store (default 20, half at N=3, half at N=5;
the sharded run 14 of its own). Long mode: ``CHAOS_FAULTS=300 scripts/chaos`` (``--shards``:
the sharded runs only). Replay: ``CHAOS_SEED=<seed>``. See README.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.apps import DOWN_WITHIN
from tests.chaos.clock import build_shim
from tests.chaos.cluster import Cluster, lease_of
from tests.chaos.faults import ACTIONS, FaultRecord, on_an_up_app
from tests.chaos.judge import (
    KNOWN_LIMIT,
    RunFacts,
    Violation,
    grants_to_down_apps,
    judge,
    judge_sharded,
    report,
    stamp,
    unled_after_settling,
)
from tests.chaos.schedule import (
    APP_KINDS,
    PROCESS_KINDS,
    FaultSpec,
    app_fault_count,
    draw,
    fault_count,
    shard_count,
)
from tests.chaos.stores import STORES
from tests.chaos.verdicts import record_verdict
from tests.support.sidecars import Sample, SidecarProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

LEASE = 1.0  # seconds: a fault cycle takes a few seconds
DEFAULT_FAULTS_PER_STORE = 20
SIZES = (3, 5)


def share(size: int) -> slice:
    """The slice of the store's schedule that the run with ``size`` replicas carries out: the
    first half with 3, the rest with 5 (so the two runs together cover every kind)."""
    total = fault_count(DEFAULT_FAULTS_PER_STORE)
    first = (total + 1) // 2
    return slice(0, first) if size == SIZES[0] else slice(first, total)


# A fault cycle is at most ~2.5 leases of fault, 2 leases + 2 s of recovery and ~1 s of
# overhead; the bound is generous so a slow machine fails on a judgment, not a timeout.
RUN_TIMEOUT = 90 + 15 * (share(SIZES[0]).stop or 0)

# The sharded run: 5 replicas, ``CHAOS_SHARDS`` (16) shards, its own schedule of
# ``CHAOS_FAULTS`` faults (14 in short mode: every kind of SQLite twice, of Redis and
# Kubernetes once; ~60-90 s per store here).
SHARDED_SIZE = 5
DEFAULT_SHARDED_FAULTS = 14
SETTLE_LEASES = 4  # after the last fault, before liveness and balance are read
SHARDED_RUN_TIMEOUT = 120 + 15 * fault_count(DEFAULT_SHARDED_FAULTS)


def line(facts_prefix: str, record: FaultRecord, started: float) -> str:
    recovered = record.recovered
    after = (
        f"leader {recovered.name} term {recovered.term} "
        f"{recovered.received - record.healed:.2f}s after heal"
        if recovered
        else "NO LEADER after heal"
    )
    return (
        f"{facts_prefix} {record.spec.describe()} at t+{record.began - started:.2f}s "
        f"({record.healed - record.began:.2f}s) [{'; '.join(record.targets)}] "
        f"{'; '.join(record.notes)} -> {after}"
    )


async def run_schedule(
    cluster: Cluster,
    specs: list[FaultSpec],
    prefix: str,
    started: float,
    recovered: Callable[[Sample], bool] = lambda s: s.leader,
) -> list[FaultRecord]:
    """Every fault in turn: carry it out, wait (bounded) for a leader after it healed (one
    that meets ``recovered``), then the seeded quiet spell; one summary line each."""
    records: list[FaultRecord] = []
    limit = 2 * LEASE + 2.0
    for spec in specs:
        record = FaultRecord(spec)
        records.append(record)
        await ACTIONS[spec.kind](cluster, spec, record)
        try:
            record.recovered = await cluster.observer.wait_for(
                lambda s, healed=record.healed: recovered(s) and s.sent >= healed,
                timeout=limit + 0.5,
            )
        except AssertionError:
            record.recovered = None  # judged from the samples: no leader past the bound
        await _settle(spec.settle)
        record.ended = time.time()
        print(line(prefix, record, started), flush=True)
    return records


def run_facts(
    cluster: Cluster,
    store_name: str,
    size: int,
    seed: int,
    times: tuple[float, float],
    records: list[FaultRecord],
    procs: object,
    logs: Path,
    **extra: object,
) -> RunFacts:
    """What the judge reads of one run: the observer's samples, the faults, the slots' clocks
    and processes; ``times``: when the run started and finished; ``extra``: a run's own
    (its fence logs, its apps...)."""
    return RunFacts(
        store=store_name,
        size=size,
        seed=seed,
        lease=LEASE,
        started=times[0],
        finished=times[1],
        samples=list(cluster.observer.samples),
        records=records,
        clocks={slot.name: slot.clock for slot in cluster.slots},
        procs=procs,  # type: ignore[arg-type]
        logs=str(logs / "logs"),
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.timeout(RUN_TIMEOUT)
@pytest.mark.parametrize("size", SIZES, ids=[f"n{size}" for size in SIZES])
@pytest.mark.parametrize("store_name", list(STORES))
async def test_chaos(store_name: str, size: int, tmp_path: Path, chaos_seed: int) -> None:
    store = STORES[store_name]()
    kinds = PROCESS_KINDS + store.kinds
    everything = draw(chaos_seed, store_name, kinds, fault_count(DEFAULT_FAULTS_PER_STORE), LEASE)
    specs = everything[share(size)]
    count = len(specs)
    prefix = f"[chaos {store_name} n={size} seed={chaos_seed}]"
    print(f"{prefix} {count} faults, lease {LEASE:g}s; replay: CHAOS_SEED={chaos_seed}", flush=True)
    cluster = Cluster(store, size, LEASE, tmp_path, build_shim(tmp_path))
    started = time.time()
    records: list[FaultRecord] = []
    try:
        await cluster.start()
        first = await cluster.leader_now(timeout=10)
        print(f"{prefix} first leader: {first and first.name} term {first and first.term}")
        # One lease of steady state first: faults hit a running cluster, not its start-up
        # (a store loss before every replica has seen the first grant is the documented
        # "a candidate that has seen nothing cannot tell" limit of docs/design.md rule 8).
        await _settle(LEASE)
        records = await run_schedule(cluster, specs, prefix, started)
        await _settle(LEASE)
        finished = time.time()
        for writer in cluster.writers:
            await writer.stop()
        fence_log = await store.fence.accepted()
        procs = _processes(cluster)
    finally:
        await cluster.stop()
    facts = run_facts(
        cluster,
        store_name,
        size,
        chaos_seed,
        (started, finished),
        records,
        procs,
        tmp_path,
        fence_log=fence_log,
    )
    violations = judge(facts)
    accepted = sum(w.counts.accepted for w in cluster.writers)
    refused = sum(w.counts.refused for w in cluster.writers)
    terms = sorted({w.term for w in fence_log})
    summary = (
        f"{len(records)} faults, {len(facts.samples)} /leader answers, fenced writes "
        f"{accepted} accepted / {refused} refused, terms {terms[:1]}..{terms[-1:]} "
        f"({len(terms)} distinct), ran {stamp(facts, finished)}"
    )
    verdict = _verdict(violations)
    record_verdict(store_name, f"n={size}", chaos_seed, f"{verdict}; {summary}")
    print(f"{prefix} verdict: {verdict}; {summary}", flush=True)
    assert not _failing(violations), report(facts, violations)


def sharded_stores() -> list[object]:
    """Every store; etcd and PostgreSQL only in long mode (``CHAOS_FAULTS`` set): 80 leases
    renewing every 1/3 s through a three-member etcd on two shared cores miss the 1 s lease's
    167 ms request timeout for seconds at a time (load 15-20: no shard led for 100 s; safety
    held), which the liveness judgment rightly counts. PostgreSQL the same (seed 1551251589
    at load 14-18: statements of 80 leases ended by the 133 ms statement timeout, not every
    shard led within 30 s of the start; safety held). docs/etcd.md and docs/postgresql.md say
    why a short lease there needs room; the single-lease runs cover every fault in short
    mode. ZooKeeper the same, through a three-member ensemble of JVMs beside the sidecars
    (its renewals are one ``multi``; the sharded round passed with ``CHAOS_FAULTS=14``)."""
    if os.environ.get("CHAOS_FAULTS"):
        return list(STORES)
    return [
        pytest.param(name, marks=pytest.mark.skip(reason=f"{name}: long mode only (docstring)"))
        if name in ("etcd", "postgresql", "zookeeper")
        else name
        for name in STORES
    ]


@pytest.mark.timeout(SHARDED_RUN_TIMEOUT)
@pytest.mark.parametrize("store_name", sharded_stores())
async def test_chaos_shards(store_name: str, tmp_path: Path, chaos_seed: int) -> None:
    """5 replicas share 16 shards (``--lease jobs --shards 16``) under the same kinds of
    faults, from a schedule of its own drawn from the same seed; every shard judged alone,
    and once the faults stop every shard has exactly one leader."""
    store = STORES[store_name]()
    kinds = PROCESS_KINDS + store.kinds
    count = fault_count(DEFAULT_SHARDED_FAULTS)
    specs = draw(chaos_seed, f"{store_name}/shards", kinds, count, LEASE)
    size, shards = SHARDED_SIZE, shard_count()
    prefix = f"[chaos {store_name} n={size} x {shards} shards seed={chaos_seed}]"
    print(f"{prefix} {count} faults, lease {LEASE:g}s; replay: CHAOS_SEED={chaos_seed}", flush=True)
    cluster = Cluster(store, size, LEASE, tmp_path, build_shim(tmp_path), shards=shards)
    started = time.time()
    records: list[FaultRecord] = []
    try:
        await cluster.start()
        await _every_shard_led(cluster, timeout=30)
        leases = cluster.shard_names()
        assert len(leases) == shards, f"the sidecars show {leases}"
        print(f"{prefix} every shard led after {time.time() - started:.1f}s: {leases[0]} …")
        await _settle(LEASE)
        records = await run_schedule(cluster, specs, prefix, started)
        quiet = time.time()
        await _settle(SETTLE_LEASES * LEASE)  # balance and hand-overs come to rest
        settled = time.time()
        await _settle(LEASE)  # a lease of answers from everyone: every shard must be led
        finished = time.time()
        balance = _balance(cluster, leases, settled)
        for writer in cluster.writers:
            await writer.stop()
        fence_logs = {lease: await store.fence.accepted(lease) for lease in leases}
        procs = _processes(cluster)
    finally:
        await cluster.stop()
    facts = run_facts(
        cluster,
        store_name,
        size,
        chaos_seed,
        (started, finished),
        records,
        procs,
        tmp_path,
        fence_log=[],
        fence_logs=fence_logs,
        shards=shards,
    )
    violations = sorted(
        [*judge_sharded(facts, leases), *unled_after_settling(facts, leases, settled)],
        key=lambda v: v.at,
    )
    accepted = sum(w.counts.accepted for w in cluster.writers)
    refused = sum(w.counts.refused for w in cluster.writers)
    terms = sum(len({w.term for w in log}) for log in fence_logs.values())
    summary = (
        f"{len(records)} faults, {len(facts.samples)} per-lease answers, fenced writes "
        f"{accepted} accepted / {refused} refused, {terms} (lease, term) pairs written, "
        f"{balance}, settled {settled - quiet:.1f}s, ran {stamp(facts, finished)}"
    )
    verdict = _verdict(violations)
    record_verdict(store_name, f"n={size}x{shards}", chaos_seed, f"{verdict}; {summary}")
    print(f"{prefix} verdict: {verdict}; {summary}", flush=True)
    assert not _failing(violations), report(facts, violations)


# The app-fault round: 3 replicas, each beside an app (`tests/chaos/apps.py`) it checks every
# 100 ms with a 100 ms timeout, 3 failures in a row = down: a dead or hung app is seen down
# within DOWN_WITHIN = 3 x 0.1 + 0.1 = 0.4 s, then the leader hands over in one write and the
# successor must learn of it (its watch or its next look) and answer 200. JOB_BOUND leaves
# that hand-over 1.6 s: on two shared, loaded cores a sidecar's loop lags by a few hundred ms
# at times, and a successor that hears of the hand-over late learns of it from the record on
# its next look. Honest, not tight: an unloaded machine does it in well under a second.
APP_SIZE = 3
JOB_BOUND = DOWN_WITHIN + 1.6
APP_RUN_TIMEOUT = 120 + 20 * app_fault_count()


APP_SHORT_STORES = ("sqlite", "kubernetes")


def app_stores() -> list[object]:
    """In short mode SQLite and Kubernetes (~40 s each on two cores: the CI budget allows
    about a minute and a half for this round); every store in long mode (``CHAOS_FAULTS`` or
    ``CHAOS_APP_FAULTS`` set; ``CHAOS_APP_FAULTS=8`` runs one store's short round). The app
    check and the hand-over are the same code on every store; the stores' own faults run in
    their single-lease runs."""
    if os.environ.get("CHAOS_FAULTS") or os.environ.get("CHAOS_APP_FAULTS"):
        return list(STORES)
    return [
        name
        if name in APP_SHORT_STORES
        else pytest.param(
            name, marks=pytest.mark.skip(reason=f"{name}: long mode only (app_stores)")
        )
        for name in STORES
    ]


@pytest.mark.timeout(APP_RUN_TIMEOUT)
@pytest.mark.parametrize("store_name", app_stores())
async def test_chaos_app(store_name: str, tmp_path: Path, chaos_seed: int) -> None:
    """Leadership follows the app (issue 30) under app faults: 3 sidecars, each checking an
    app of its own (``--app-health-url``), their fenced writers writing only while their app
    is up. The target's app killed and restarted, hung and resumed, flapping fast then slow,
    and every app down at once then back one by one; from a schedule of its own (stream
    ``<store>/app``). Judged as every run (1-6), and on the job being back on an up app
    within `JOB_BOUND` whenever some app is up (7)."""
    store = STORES[store_name]()
    count = app_fault_count()
    specs = draw(chaos_seed, f"{store_name}/app", APP_KINDS, count, LEASE)
    size = APP_SIZE
    prefix = f"[chaos {store_name} apps n={size} seed={chaos_seed}]"
    print(
        f"{prefix} {count} faults, lease {LEASE:g}s, job bound {JOB_BOUND:g}s; "
        f"replay: CHAOS_SEED={chaos_seed}",
        flush=True,
    )
    cluster = Cluster(store, size, LEASE, tmp_path, build_shim(tmp_path), apps=True)
    started = time.time()
    records: list[FaultRecord] = []
    try:
        await cluster.start()
        first = await cluster.leader_now(timeout=10)
        print(f"{prefix} first leader: {first and first.name} term {first and first.term}")
        await _settle(LEASE)
        records = await run_schedule(
            cluster, specs, prefix, started, lambda s: on_an_up_app(cluster, s)
        )
        await _settle(JOB_BOUND + 0.5)  # a job left on a down app at the end is seen
        finished = time.time()
        for writer in cluster.writers:
            await writer.stop()
        fence_log = await store.fence.accepted()
        procs = _processes(cluster)
    finally:
        await cluster.stop()
    facts = run_facts(
        cluster,
        store_name,
        size,
        chaos_seed,
        (started, finished),
        records,
        procs,
        tmp_path,
        fence_log=fence_log,
        apps={name: app.up_intervals(finished) for name, app in cluster.apps.items()},
        job_bound=JOB_BOUND,
    )
    violations = judge(facts)
    accepted = sum(w.counts.accepted for w in cluster.writers)
    refused = sum(w.counts.refused for w in cluster.writers)
    terms = sorted({w.term for w in fence_log})
    handovers = _log_count(cluster, "the app is down: handing the leases to a replica")
    kept = _log_count(cluster, "the app is down and no other replica's app is up")
    down_grants = grants_to_down_apps(facts, grace=DOWN_WITHIN + 0.3)
    summary = (
        f"{len(records)} faults, {len(facts.samples)} /leader answers, fenced writes "
        f"{accepted} accepted / {refused} refused, terms {terms[:1]}..{terms[-1:]} "
        f"({len(terms)} distinct), {handovers} app_down hand-overs, {kept} kept alone, "
        f"grants to a down app: {down_grants or 0}, ran {stamp(facts, finished)}"
    )
    verdict = _verdict(violations)
    record_verdict(store_name, f"apps n={size}", chaos_seed, f"{verdict}; {summary}")
    print(f"{prefix} verdict: {verdict}; {summary}", flush=True)
    assert not _failing(violations), report(facts, violations)


def _log_count(cluster: Cluster, message: str) -> int:
    """Log lines of every sidecar whose message begins with ``message``."""
    return sum(
        1
        for _slot, proc in cluster.all_processes()
        for entry in proc.logs
        if str(entry.get("msg", "")).startswith(message)
    )


def _processes(cluster: Cluster) -> list[tuple[SidecarProcess, bool, int | None]]:
    return [
        (proc, proc.proc.pid in slot.ended_on_purpose, proc.proc.poll())
        for slot, proc in cluster.all_processes()
    ]


def _verdict(violations: list[Violation]) -> str:
    by_kind: dict[str, int] = {}
    for violation in violations:
        by_kind[violation.judgment] = by_kind.get(violation.judgment, 0) + 1
    if not violations:
        return "PASS"
    if not _failing(violations):
        return f"PASS with documented limits {by_kind}"
    return f"FAIL {by_kind}"


def _failing(violations: list[Violation]) -> list[Violation]:
    """What fails a run: everything but the README's documented limits, which are reported."""
    return [v for v in violations if not v.judgment.startswith(KNOWN_LIMIT)]


async def _every_shard_led(cluster: Cluster, timeout: float) -> None:
    """Until the observer has seen a leader of every shard (the start-up's grants)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        led = {lease_of(s) for s in cluster.observer.samples if s.leader}
        if len(led) >= cluster.shards:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not every shard got a leader within {timeout}s")


def _balance(cluster: Cluster, leases: list[str], since: float) -> str:
    """Informational: shards per replica in each one's last answer, and how many leases the
    replicas handed over to balance (their ``handing the lease over`` log lines)."""
    held: dict[str, int] = {}
    last: dict[tuple[str, str], Sample] = {}
    for sample in cluster.observer.samples:
        lease = lease_of(sample)
        if lease is not None and sample.sent >= since:
            last[(sample.name, lease)] = sample
    for (name, _lease), sample in last.items():
        if sample.leader:
            held[name] = held.get(name, 0) + 1
    moves = sum(
        1
        for _slot, proc in cluster.all_processes()
        for entry in proc.logs
        if entry.get("msg") == "handing the lease over" and entry.get("why") == "balance"
    )
    per_replica = ",".join(f"{slot.name}={held.get(slot.name, 0)}" for slot in cluster.slots)
    live = sum(1 for slot in cluster.slots if slot.proc.proc.poll() is None)
    share = -(-len(leases) // max(live, 1))
    return (
        f"balance: max {max(held.values(), default=0)} shards per replica (share {share}; "
        f"{per_replica}), {moves} balance moves"
    )


async def _settle(seconds: float) -> None:
    """A deliberate quiet spell between faults (its length is drawn from the seed)."""
    await asyncio.sleep(seconds)
