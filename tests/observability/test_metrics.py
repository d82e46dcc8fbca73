"""The exported metric set: names, types and label sets exactly as docs/design.md lists them, in
both shapes (`--metrics-per-lease` or not), the lease group each lease is counted under, and
renewal-gap buckets that are fractions of the lease with one edge at exactly half of it."""

from __future__ import annotations

import math
import random
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from sidecar import config
from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore
from sidecar.elector import Elector
from sidecar.metrics import GAP_FRACTIONS, Metrics, for_config, gap_buckets
from sidecar.timing import Timing
from tests.observability.fakes import FakeClock, FlakyStore
from tests.support.tools import REPO, require_binary

# Per lease always: what an alert or a person needs for each lease.
EACH = frozenset({"lease", "lease_group"})
# Per lease group (the --lease name shards are made from), and per lease too with
# --metrics-per-lease.
PER_GROUP = {
    "leader_sidecar_lease_duration_seconds": ("gauge", frozenset()),
    "leader_sidecar_renewal_gap_seconds": ("histogram", frozenset()),
    "leader_sidecar_transitions": ("counter", frozenset({"role"})),
    "leader_sidecar_demotions": ("counter", frozenset({"reason"})),
    "leader_sidecar_store_requests": ("counter", frozenset({"op", "outcome"})),
    "leader_sidecar_store_request_duration_seconds": ("histogram", frozenset({"op"})),
}
# Families of the whole sidecar, not of one lease: no `lease`, no `lease_group`.
SIDECAR_WIDE = {"leader_sidecar_bad_records": ("counter", frozenset({"kind"}))}
ROLES = {"leader", "follower"}
REASONS = {"lost", "deadline", "released", "shutdown", "app_down", "drain", "hold"}
# Per lease, but only for a lease on an operator's hold: no series otherwise.
ON_HOLD_ONLY = {"leader_sidecar_hold_seconds", "leader_sidecar_hold_duration_seconds"}
OPS = {
    "acquire", "renew", "read", "release", "hand_over", "mark_lost",
    "probe", "candidate_beat", "candidate_list",
}  # fmt: skip
OUTCOMES = {"ok", "timeout", "held", "not_owned", "conflict", "unavailable", "cancelled", "error"}

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)


def expected(per_lease: bool) -> dict[str, tuple[str, frozenset[str]]]:
    """docs/design.md's metrics table: family name → (type, label names other than `le`). No
    other family may be exported."""
    grouped = EACH if per_lease else frozenset({"lease_group"})
    design = {
        "leader_sidecar_is_leader": ("gauge", EACH),
        "leader_sidecar_term": ("gauge", EACH),
        "leader_sidecar_since_renewal_seconds": ("gauge", EACH),
        "leader_sidecar_renewal_gap_over_half_lease": ("counter", EACH),
        **{name: ("gauge", EACH) for name in ON_HOLD_ONLY},
        **{name: (kind, grouped | more) for name, (kind, more) in PER_GROUP.items()},
        **SIDECAR_WIDE,
    }
    if per_lease:  # client-go's, part of the per-lease detail
        design["leader_election_master_status"] = ("gauge", frozenset({"name"}))
        # The name before issue 32, for one release (docs/operations.md#renamed-metrics).
        design["leader_sidecar_seconds_since_renewal"] = ("gauge", EACH)
    return design


def families(registry: CollectorRegistry) -> dict[str, tuple[str, list[Sample]]]:
    """The exposition as Prometheus would parse it, without the client library's ``_created``
    timestamps (an exposition detail of prometheus_client, not part of our metric set)."""
    text = generate_latest(registry).decode()
    return {
        family.name: (family.type, family.samples)
        for family in text_string_to_metric_families(text)
        if not family.name.endswith("_created")
    }


async def busy_elector(per_lease: bool) -> Elector:
    """An elector of the shard team/jobs-3 that has acquired, renewed, and seen the store
    fail: every family has samples."""
    clock = FakeClock()
    store = FlakyStore(MemoryLeaseStore(MemoryLeaseState(clock), "unit"))
    metrics = Metrics(
        CollectorRegistry(),
        "team/jobs-3",
        TIMING.lease_duration,
        group="team/jobs",
        per_lease=per_lease,
    )
    elector = Elector(
        store, TIMING, "a_0001", "team/jobs-3", metrics=metrics, clock=clock, rng=random.Random(1)
    )
    await elector.step()  # acquire
    clock.advance(3)
    await elector.step()  # renew
    store.down = True
    clock.advance(3)
    await elector.step()  # renew fails
    return elector


SHAPES = pytest.mark.parametrize("per_lease", [False, True], ids=["per-group", "per-lease"])


@SHAPES
async def test_the_exported_families_are_exactly_those_of_the_design(per_lease: bool) -> None:
    """Names, types and label names match docs/design.md; nothing else is exported."""
    elector = await busy_elector(per_lease)
    exported = families(elector.metrics.registry)
    design = expected(per_lease)
    assert {name: kind for name, (kind, _) in exported.items()} == {
        name: kind for name, (kind, _) in design.items()
    }
    for name, (_, samples) in exported.items():
        labels = design[name][1]
        assert samples or name in ON_HOLD_ONLY, name
        for sample in samples:
            names = set(sample.labels) - ({"le"} if sample.name.endswith("_bucket") else set())
            assert names == labels, (sample.name, sample.labels)


@SHAPES
async def test_every_series_names_its_lease_group_and_the_per_lease_ones_their_lease(
    per_lease: bool,
) -> None:
    """``lease_group`` on every leader_sidecar_* series of a lease, ``lease`` where the
    family is per lease, ``name`` on the client-go one: the rules group by them."""
    elector = await busy_elector(per_lease)
    for name, (_, samples) in families(elector.metrics.registry).items():
        if name in SIDECAR_WIDE or name in ON_HOLD_ONLY:
            continue
        if name == "leader_election_master_status":
            assert {sample.labels["name"] for sample in samples} == {"team/jobs-3"}
            continue
        assert {sample.labels["lease_group"] for sample in samples} == {"team/jobs"}, name
        if "lease" in expected(per_lease)[name][1]:
            assert {sample.labels["lease"] for sample in samples} == {"team/jobs-3"}, name


@SHAPES
async def test_label_values_are_bounded_enumerations(per_lease: bool) -> None:
    """role, reason, op and outcome only take the documented values."""
    elector = await busy_elector(per_lease)
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


def test_every_store_operation_the_sidecar_counts_is_documented() -> None:
    """The ``op`` values in the code are those docs/operations.md lists (and OPS above)."""
    import re

    root = Path(__file__).resolve().parents[2]
    code = "\n".join(path.read_text() for path in (root / "sidecar").glob("*.py"))
    used = set(re.findall(r'(?:_call|\.request)\(\s*"(\w+)"', code))
    used |= set(re.findall(r'_count\(\s*"(\w+)"', code))
    assert used == OPS
    table = (root / "docs" / "operations.md").read_text()
    for op in OPS:
        assert f"`{op}`" in table, op


@SHAPES
def test_a_fresh_registry_exports_zeros_for_every_counter_an_alert_reads(per_lease: bool) -> None:
    """increase() cannot see a series' first sample: counters start at 0, so the first gap,
    transition, demotion or store failure after start-up is an increase."""
    registry = CollectorRegistry()
    Metrics(registry, "jobs-0", 15.0, group="jobs", per_lease=per_lease)
    each = {"lease": "jobs-0", "lease_group": "jobs"}
    grouped = each if per_lease else {"lease_group": "jobs"}

    def value(name: str, labels: dict[str, str], **more: str) -> float | None:
        return registry.get_sample_value(name, {**labels, **more})

    assert value("leader_sidecar_renewal_gap_over_half_lease_total", each) == 0.0
    for role in ROLES:
        assert value("leader_sidecar_transitions_total", grouped, role=role) == 0.0
    for reason in REASONS:
        assert value("leader_sidecar_demotions_total", grouped, reason=reason) == 0.0
    for op in ("acquire", "renew"):
        for outcome in ("ok", "timeout", "unavailable", "error"):
            assert (
                value("leader_sidecar_store_requests_total", grouped, op=op, outcome=outcome) == 0.0
            )
    assert value("leader_sidecar_lease_duration_seconds", grouped) == 15.0


@SHAPES
def test_promtool_finds_nothing_to_lint_in_the_exposition(per_lease: bool) -> None:
    """Prometheus's own linter (naming, units, suffixes) accepts the exposition."""
    promtool = require_binary("promtool")
    registry = CollectorRegistry()
    for shard in range(3):
        Metrics(registry, f"jobs-{shard}", 15.0, group="jobs", per_lease=per_lease)
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == ""


# -- lease groups -----------------------------------------------------------------------------


def configured(*argv: str) -> config.Config:
    return config.load(["--store", "kubernetes", *argv], {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


@pytest.mark.parametrize(
    ("argv", "groups", "per_lease"),
    [
        (["--lease", "app"], {"team/app": "team/app"}, True),
        (["--lease", "a,b"], {"team/a": "team/a", "team/b": "team/b"}, True),
        (
            ["--lease", "jobs,billing", "--shards", "2"],
            {
                "team/jobs-0": "team/jobs",
                "team/jobs-1": "team/jobs",
                "team/billing-0": "team/billing",
                "team/billing-1": "team/billing",
            },
            False,
        ),
        (["--lease", "jobs-1", "--shards", "2"], {"team/jobs-1-0": "team/jobs-1"}, False),
        (
            ["--lease", "jobs", "--shards", "1", "--metrics-per-lease", "true"],
            {"team/jobs-0": "team/jobs"},
            True,
        ),
        (["--lease", "app", "--metrics-per-lease", "false"], {"team/app": "team/app"}, False),
    ],
    ids=["one lease", "two leases", "shards", "dashed name", "shards, per lease", "one, not"],
)
def test_a_lease_is_counted_under_the_lease_name_its_shards_were_made_from(
    argv: list[str], groups: dict[str, str], per_lease: bool
) -> None:
    """``lease_group`` is the --lease name (as leases are named: namespace/name on
    Kubernetes); per-lease detail is the default exactly when there are no shards."""
    loaded = configured("--namespace", "team", *argv)
    registry = CollectorRegistry()
    make = for_config(loaded, registry)
    shown = [loaded.ref(name) for name in loaded.lease_names]
    made = [make(lease) for lease in shown]
    assert {m.lease: m.group for m in made}.items() >= groups.items()
    assert loaded.per_lease_metrics is per_lease
    assert ("leader_election_master_status" in families(registry)) is per_lease


def test_the_leases_of_a_group_share_its_histograms_and_counters() -> None:
    """Without per-lease detail, every shard's renewal gap, transition and store request
    lands in its group's one series; the per-lease families stay per lease."""
    registry = CollectorRegistry()
    shards = [Metrics(registry, f"jobs-{i}", 15.0, group="jobs", per_lease=False) for i in range(3)]
    for metrics in shards:
        metrics.renewal_gap.observe(5.0)
        metrics.transition("leader")
        metrics.store_request("renew", "ok", 0.002)
        metrics.gap_over_half_lease.inc()
    group = {"lease_group": "jobs"}
    assert registry.get_sample_value("leader_sidecar_renewal_gap_seconds_count", group) == 3
    assert (
        registry.get_sample_value("leader_sidecar_transitions_total", {**group, "role": "leader"})
        == 3
    )
    requests = {**group, "op": "renew", "outcome": "ok"}
    assert registry.get_sample_value("leader_sidecar_store_requests_total", requests) == 3
    for i in range(3):
        each = {"lease": f"jobs-{i}", "lease_group": "jobs"}
        assert (
            registry.get_sample_value("leader_sidecar_renewal_gap_over_half_lease_total", each) == 1
        )


def test_per_lease_detail_is_one_choice_per_registry() -> None:
    """Two shapes in one exposition would double-count every sum the rules take."""
    registry = CollectorRegistry()
    Metrics(registry, "jobs-0", 15.0, group="jobs", per_lease=False)
    with pytest.raises(ValueError, match="per_lease"):
        Metrics(registry, "jobs-1", 15.0, group="jobs", per_lease=True)


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
    labels = {"lease": "default", "lease_group": "default"}
    half = {**labels, "le": floatToGoString(lease / 2)}
    assert registry.get_sample_value("leader_sidecar_renewal_gap_seconds_bucket", half) == 1.0
    count = registry.get_sample_value("leader_sidecar_renewal_gap_seconds_count", labels)
    assert count == 2.0


def test_no_shipped_rule_or_dashboard_reads_a_name_kept_only_for_one_release() -> None:
    """``leader_sidecar_seconds_since_renewal`` is exported for one release after its rename
    (issue 32); what we ship must already read ``leader_sidecar_since_renewal_seconds``, so
    the old name can go without breaking an alert."""
    shipped = [
        REPO / "sidecar" / "prometheus" / "rules.yaml",
        REPO / "sidecar" / "prometheus" / "dashboard.json",
        *(p for p in (REPO / "charts" / "leader-sidecar").rglob("*") if p.is_file()),
    ]
    for path in shipped:
        text = path.read_text()
        assert "seconds_since_renewal" not in text, path
    assert "leader_sidecar_since_renewal_seconds" in shipped[0].read_text()
    assert "leader_sidecar_since_renewal_seconds" in shipped[1].read_text()
    notes = (REPO / "docs" / "operations.md").read_text()
    assert "### Renamed metrics" in notes
    assert "for this release only" in notes


def test_gap_bucket_edges_are_those_of_exact_fractions() -> None:
    """`gap_buckets` computes its edges with integers; they are exactly what
    `fractions.Fraction` of the lease as written gives, for durations as typed and for
    arbitrary floats (tiny, huge, with an exponent)."""
    rng = random.Random(7)
    leases = [0.001, 0.3, 1.0, 1.5, 2.0, 3.0, 4.5, 10.0, 15.0, 60.0, 3600.0, 1e-05, 1.5e20]
    leases += [rng.uniform(0.001, 100.0) for _ in range(500)]
    leases += [10 ** rng.uniform(-6, 22) for _ in range(500)]
    for lease in leases:
        exact = Fraction(repr(lease))
        assert gap_buckets(lease) == [float(exact * n / d) for n, d in GAP_FRACTIONS], lease
