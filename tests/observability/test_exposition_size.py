"""What one scrape of a sidecar with 1,000 shards costs Prometheus: series and bytes of
``/metrics``, counted (not timed), at the exposition's largest — every lease has led, every
store operation has seen every outcome — so no run can export more. docs/operations.md
("What a scrape costs") quotes these figures."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import config
from sidecar.metrics import for_config
from sidecar.supervisor import Supervisor
from tests.observability.test_metrics import OPS, OUTCOMES, ROLES

# The target for 1,000 leases, per replica: under a common per-target sample_limit.
MAX_SERIES = 5_000
MAX_BYTES = 500_000


class Leading:
    """A lease led for a second (`sidecar.metrics.ScrapedState`)."""

    def is_leader(self) -> bool:
        return True

    def seconds_since_renewal(self) -> float:
        return 1.0

    def hold_shown(self) -> tuple[float, float] | None:
        return None  # not on hold: the hold's families have no series


def largest_exposition(*argv: str) -> tuple[int, int]:
    """(series, bytes) of the sidecar's registry once every label value has been used."""
    loaded = config.load(
        ["--store", "kubernetes", "--namespace", "payments", *argv],
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1"},
    )
    registry = CollectorRegistry()
    Supervisor(registry)  # task_failures_total, as the sidecar registers it
    make = for_config(loaded, registry)
    for name in loaded.lease_names:
        metrics = make(loaded.ref(name))
        metrics.bind(Leading())
        metrics.term.set(123456)
        for role in ROLES:
            metrics.transition(role)
        for gap in (1.0, 5.0, 7.6, 14.0, 15.0):
            metrics.renewal_gap.observe(gap)
        for op in OPS:
            for outcome in OUTCOMES:
                metrics.store_request(op, outcome, 0.0123)
    text = generate_latest(registry)
    series = sum(len(f.samples) for f in text_string_to_metric_families(text.decode()))
    return series, len(text)


@pytest.fixture(autouse=True)
def without_created_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the sidecar runs (sidecar/cli.py): no ``*_created`` series."""
    import prometheus_client.metrics

    monkeypatch.setattr(prometheus_client.metrics, "_use_created", False)


def test_a_thousand_shards_fit_the_target_by_default() -> None:
    """--shards 1000: 4 series per lease (leader, term, renewal age, gaps past half the
    lease) and one group's worth of the rest."""
    series, size = largest_exposition("--lease", "jobs", "--shards", "1000")
    print(f"--shards 1000: {series} series, {size} bytes")
    assert series <= MAX_SERIES
    assert size <= MAX_BYTES
    assert series >= 4_000  # every lease still has its four


def test_the_per_lease_flag_labels_everything_by_lease_again() -> None:
    """--metrics-per-lease true: each lease carries every family again, ~233 series per lease
    at the largest (233,002 and 30 MB at 1,000 shards; counted here at 100 to stay quick) —
    far past the target, which is why it is not the default with shards."""
    series, size = largest_exposition(
        "--lease", "jobs", "--shards", "100", "--metrics-per-lease", "true"
    )
    print(f"--shards 100 --metrics-per-lease true: {series} series, {size} bytes")
    assert series > 200 * 100


def test_one_lease_costs_a_few_hundred_series() -> None:
    series, size = largest_exposition("--lease", "app")
    print(f"one lease: {series} series, {size} bytes")
    assert series < 300


def test_the_per_lease_families_scrape_without_prometheus_clients_private_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-lease families read prometheus_client's private ``_use_created`` to match its
    own families; a release without it must not fail every scrape: they emit ``_created``, as
    prometheus_client does by default."""
    import prometheus_client.metrics

    from sidecar.metrics import _PerLease

    registry = CollectorRegistry()
    make = for_config(config.load(["--lease", "jobs"], {}), registry)
    make("jobs").bind(Leading())
    monkeypatch.delattr(prometheus_client.metrics, "_use_created")
    collectors = [c for c in registry._collector_to_names if isinstance(c, _PerLease)]
    # (two only for a lease on hold, one the old name of a renamed gauge for one release)
    assert len(collectors) == 7
    samples = {s.name for c in collectors for family in c.collect() for s in family.samples}
    assert "leader_sidecar_is_leader" in samples
    assert "leader_sidecar_renewal_gap_over_half_lease_created" in samples
