"""The chaos suite: N real sidecars per store (3 and 5), a fenced writer beside each, an
observer on every ``/leader``, and a seeded schedule of faults; judged by `judge.judge`.

Short mode (CI): ``CHAOS_FAULTS`` faults per store (default 20, half at N=3, half at N=5).
Long mode: ``CHAOS_FAULTS=300 scripts/chaos``. Replay: ``CHAOS_SEED=<seed>``. See README.md.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.chaos.clock import build_shim
from tests.chaos.cluster import Cluster
from tests.chaos.faults import ACTIONS, FaultRecord
from tests.chaos.judge import RunFacts, judge, report, stamp
from tests.chaos.schedule import PROCESS_KINDS, draw, fault_count
from tests.chaos.stores import STORES
from tests.chaos.verdicts import record_verdict

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
    limit = 2 * LEASE + 2.0
    try:
        await cluster.start()
        first = await cluster.leader_now(timeout=10)
        print(f"{prefix} first leader: {first and first.name} term {first and first.term}")
        # One lease of steady state first: faults hit a running cluster, not its start-up
        # (a store loss before every replica has seen the first grant is the documented
        # "a candidate that has seen nothing cannot tell" limit of DESIGN.md rule 8).
        await _settle(LEASE)
        for spec in specs:
            record = FaultRecord(spec)
            records.append(record)
            await ACTIONS[spec.kind](cluster, spec, record)
            try:
                record.recovered = await cluster.observer.wait_for(
                    lambda s, healed=record.healed: s.leader and s.sent >= healed,
                    timeout=limit + 0.5,
                )
            except AssertionError:
                record.recovered = None  # judged from the samples: no leader past the bound
            await _settle(spec.settle)
            record.ended = time.time()
            print(line(prefix, record, started), flush=True)
        await _settle(LEASE)
        finished = time.time()
        for writer in cluster.writers:
            await writer.stop()
        fence_log = await store.fence.accepted()
        procs = [
            (proc, proc.proc.pid in slot.ended_on_purpose, proc.proc.poll())
            for slot, proc in cluster.all_processes()
        ]
    finally:
        await cluster.stop()
    facts = RunFacts(
        store=store_name,
        size=size,
        seed=chaos_seed,
        lease=LEASE,
        started=started,
        finished=finished,
        samples=list(cluster.observer.samples),
        fence_log=fence_log,
        records=records,
        clocks={slot.name: slot.clock for slot in cluster.slots},
        procs=procs,
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
    by_kind: dict[str, int] = {}
    for violation in violations:
        by_kind[violation.judgment] = by_kind.get(violation.judgment, 0) + 1
    verdict = "PASS" if not violations else f"FAIL {by_kind}"
    record_verdict(store_name, size, chaos_seed, f"{verdict}; {summary}")
    print(f"{prefix} verdict: {verdict}; {summary}", flush=True)
    assert not violations, report(facts, violations)


async def _settle(seconds: float) -> None:
    """A deliberate quiet spell between faults (its length is drawn from the seed)."""
    await asyncio.sleep(seconds)
