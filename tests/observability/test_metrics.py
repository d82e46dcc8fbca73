"""The exported metric set: names, types and label sets exactly as docs/design.md lists them, and
renewal-gap buckets that are fractions of the lease with one edge at exactly half of it."""

from __future__ import annotations

import math
import random
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore
from sidecar.config import Timing
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from tests.observability.fakes import FakeClock, FlakyStore
from tests.support.tools import require_binary

# docs/design.md's metrics table, plus client-go's leader_election_master_status: family name →
# (type, label names other than `le`). No other family may be exported.
EXPECTED: dict[str, tuple[str, frozenset[str]]] = {
    "leader_sidecar_is_leader": ("gauge", frozenset({"lease"})),
    "leader_sidecar_term": ("gauge", frozenset({"lease"})),
    "leader_sidecar_lease_duration_seconds": ("gauge", frozenset({"lease"})),
    "leader_sidecar_renewal_gap_seconds": ("histogram", frozenset({"lease"})),
    "leader_sidecar_seconds_since_renewal": ("gauge", frozenset({"lease"})),
    "leader_sidecar_renewal_gap_over_half_lease": ("counter", frozenset({"lease"})),
    "leader_sidecar_transitions": ("counter", frozenset({"lease", "role"})),
    "leader_sidecar_demotions": ("counter", frozenset({"lease", "reason"})),
    "leader_sidecar_store_requests": ("counter", frozenset({"lease", "op", "outcome"})),
    "leader_sidecar_store_request_duration_seconds": ("histogram", frozenset({"lease", "op"})),
    "leader_sidecar_bad_records": ("counter", frozenset({"kind"})),
    "leader_election_master_status": ("gauge", frozenset({"name"})),
}
# Families of the whole sidecar, not of one lease: they carry no `lease` label.
SIDECAR_WIDE = {"leader_sidecar_bad_records"}
ROLES = {"leader", "follower"}
REASONS = {"lost", "deadline", "released", "shutdown"}
OPS = {"acquire", "renew", "release"}
OUTCOMES = {"ok", "timeout", "held", "not_owned", "conflict", "unavailable", "cancelled", "error"}

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)


def families(registry: CollectorRegistry) -> dict[str, tuple[str, list[Sample]]]:
    """The exposition as Prometheus would parse it, without the client library's ``_created``
    timestamps (an exposition detail of prometheus_client, not part of our metric set)."""
    text = generate_latest(registry).decode()
    return {
        family.name: (family.type, family.samples)
        for family in text_string_to_metric_families(text)
        if not family.name.endswith("_created")
    }


async def busy_elector() -> Elector:
    """An elector that has acquired, renewed, and seen the store fail: every family has
    samples."""
    clock = FakeClock()
    store = FlakyStore(MemoryLeaseStore(MemoryLeaseState(clock), "unit"))
    elector = Elector(
        store,
        TIMING,
        "a_0001",
        "team/jobs",
        metrics=Metrics(CollectorRegistry(), "team/jobs", TIMING.lease_duration),
        clock=clock,
        rng=random.Random(1),
    )
    await elector.step()  # acquire
    clock.advance(3)
    await elector.step()  # renew
    store.down = True
    clock.advance(3)
    await elector.step()  # renew fails
    return elector


async def test_the_exported_families_are_exactly_those_of_the_design() -> None:
    """Names, types and label names match docs/design.md; nothing else is exported."""
    elector = await busy_elector()
    exported = families(elector.metrics.registry)
    assert {name: kind for name, (kind, _) in exported.items()} == {
        name: kind for name, (kind, _) in EXPECTED.items()
    }
    for name, (_, samples) in exported.items():
        labels = EXPECTED[name][1]
        assert samples, name
        for sample in samples:
            names = set(sample.labels) - ({"le"} if sample.name.endswith("_bucket") else set())
            assert names == labels, (sample.name, sample.labels)


async def test_every_series_names_the_lease() -> None:
    """``lease`` on every per-lease leader_sidecar_* series, ``name`` on the client-go one: the
    rules group by it."""
    elector = await busy_elector()
    for name, (_, samples) in families(elector.metrics.registry).items():
        if name in SIDECAR_WIDE:
            continue
        key = "name" if name == "leader_election_master_status" else "lease"
        assert {sample.labels[key] for sample in samples} == {"team/jobs"}, name


async def test_label_values_are_bounded_enumerations() -> None:
    """role, reason, op and outcome only take the documented values."""
    elector = await busy_elector()
    exported = families(elector.metrics.registry)
    seen: dict[str, set[str]] = {"role": set(), "reason": set(), "op": set(), "outcome": set()}
    for _, samples in exported.values():
        for sample in samples:
            for key, values in seen.items():
                if key in sample.labels:
                    values.add(sample.labels[key])
    assert seen["role"] == ROLES
    assert seen["reason"] == REASONS
    assert seen["op"] <= OPS
    assert {"acquire", "renew"} <= seen["op"]
    assert seen["outcome"] <= OUTCOMES
    assert {"ok", "unavailable"} <= seen["outcome"]


def test_a_fresh_registry_exports_zeros_for_every_counter_an_alert_reads() -> None:
    """increase() cannot see a series' first sample: counters start at 0, so the first gap,
    transition, demotion or store failure after start-up is an increase."""
    registry = CollectorRegistry()
    Metrics(registry, "default", 15.0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"lease": "default", **labels})

    assert value("leader_sidecar_renewal_gap_over_half_lease_total") == 0.0
    for role in ROLES:
        assert value("leader_sidecar_transitions_total", role=role) == 0.0
    for reason in REASONS:
        assert value("leader_sidecar_demotions_total", reason=reason) == 0.0
    for op in ("acquire", "renew"):
        for outcome in ("ok", "timeout", "unavailable", "error"):
            assert value("leader_sidecar_store_requests_total", op=op, outcome=outcome) == 0.0
    assert value("leader_sidecar_lease_duration_seconds") == 15.0


def test_promtool_finds_nothing_to_lint_in_the_exposition() -> None:
    """Prometheus's own linter (naming, units, suffixes) accepts the exposition."""
    promtool = require_binary("promtool")
    registry = CollectorRegistry()
    Metrics(registry, "default", 15.0)
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == ""


# -- the renewal-gap buckets ------------------------------------------------------------------

# The `le` label values Prometheus stores, per lease: fractions 1/10 … 1 of the lease, written
# as the decimal the lease was, with 1/2 among them.
BUCKETS = {
    15.0: "1.5 3.0 3.75 5.0 6.0 7.5 9.0 10.0 11.25 13.5 15.0",
    2.0: "0.2 0.4 0.5 0.6666666666666666 0.8 1.0 1.2 1.3333333333333333 1.5 1.8 2.0",
    3.0: "0.3 0.6 0.75 1.0 1.2 1.5 1.8 2.0 2.25 2.7 3.0",
    4.5: "0.45 0.9 1.125 1.5 1.8 2.25 2.7 3.0 3.375 4.05 4.5",
    0.3: "0.03 0.06 0.075 0.1 0.12 0.15 0.18 0.2 0.225 0.27 0.3",
    60.0: "6.0 12.0 15.0 20.0 24.0 30.0 36.0 40.0 45.0 54.0 60.0",
}


def gap_bucket_edges(registry: CollectorRegistry) -> list[str]:
    _, samples = families(registry)["leader_sidecar_renewal_gap_seconds"]
    return [s.labels["le"] for s in samples if s.name.endswith("_bucket")]


@pytest.mark.parametrize("lease", sorted(BUCKETS))
def test_gap_buckets_are_fractions_of_the_lease_with_an_edge_at_exactly_half(
    lease: float,
) -> None:
    """The `le` values read as the lease's fractions, and one of them is exactly lease / 2."""
    registry = CollectorRegistry()
    Metrics(registry, "default", lease)
    edges = gap_bucket_edges(registry)
    assert edges == [*BUCKETS[lease].split(), "+Inf"]
    assert floatToGoString(lease / 2) in edges


@pytest.mark.parametrize("lease", sorted(BUCKETS))
def test_a_gap_of_exactly_half_the_lease_counts_at_or_below_the_half_edge(lease: float) -> None:
    """The half-lease bucket holds a gap of exactly half (not alerted: the alert is strictly
    past half) and not the next larger float (alerted)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, "default", lease)
    metrics.renewal_gap.observe(lease / 2)
    metrics.renewal_gap.observe(math.nextafter(lease / 2, math.inf))
    half = {"lease": "default", "le": floatToGoString(lease / 2)}
    assert registry.get_sample_value("leader_sidecar_renewal_gap_seconds_bucket", half) == 1.0
    count = registry.get_sample_value(
        "leader_sidecar_renewal_gap_seconds_count", {"lease": "default"}
    )
    assert count == 2.0
