"""End to end with shards, in the default shape they export (only leader, term, renewal age and
gaps past half the lease per lease; the rest per lease group): a real Prometheus scrapes three
real sidecars running ``--lease jobs --shards 4`` on one SQLite file and evaluates our rule
file. Every rule evaluates and every dashboard query returns data; with the store stalled the
gap alert fires for each shard, naming the replica that leads it, and the lease-lost page
follows per replica and lease group, counting the shards each replica lost."""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.observability.prometheus_server import Prometheus, poll, prometheus
from tests.observability.promql import RULES, alerting_rules, dashboard_queries
from tests.observability.test_prometheus_e2e import FIRST_SCRAPE, GAP_ALERT, LEASE, ours
from tests.support.sidecars import sidecars
from tests.support.tools import require_binary

pytestmark = pytest.mark.slow

SHARDS = [f"jobs-{i}" for i in range(4)]


def leaders(prom: Prometheus) -> dict[str, str] | None:
    """shard → the instance leading it, once every replica is scraped and every shard has
    exactly one leader."""
    up = prom.query('up{job="leader-sidecar"} == 1')
    counts = prom.query("sum by (lease) (leader_sidecar_is_leader)")
    if len(up) != 3 or sorted(s["metric"]["lease"] for s in counts) != SHARDS:
        return None
    if any(float(s["value"][1]) != 1 for s in counts):
        return None
    led = {
        s["metric"]["lease"]: s["metric"]["instance"]
        for s in prom.query("leader_sidecar_is_leader == 1")
    }
    # Balanced (nobody above ceil(4 / 3)), so the balancer moves nothing any more.
    return led if max(Counter(led.values()).values()) <= 2 else None


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Prometheus]]:
    binary = require_binary("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus-e2e-sharded")
    db = workdir / "leases.db"
    args = ["--lease", "jobs", "--shards", "4"]
    with contextlib.ExitStack() as running:
        procs = running.enter_context(
            sidecars(["a", "b", "c"], f"sqlite:///{db}", lease_duration=f"{LEASE}s", args=args)
        )
        prom = running.enter_context(
            prometheus(binary, workdir, [proc.public for proc in procs], [RULES])
        )
        try:
            poll(
                partial(leaders, prom),
                FIRST_SCRAPE,
                "three sidecars scraped, 4 shards led, balanced",
            )
            yield db, prom
        except BaseException:
            print("prometheus log:\n" + prom.log_tail())
            raise


def test_the_shards_export_the_per_group_shape(stack: tuple[Path, Prometheus]) -> None:
    """Per lease only the four families the alerts read per lease; the rest per group."""
    _, prom = stack
    assert {s["metric"]["lease"] for s in prom.query("leader_sidecar_term")} == set(SHARDS)
    for name in ("leader_sidecar_store_requests_total", "leader_sidecar_demotions_total"):
        series = prom.query(name)
        assert series, name
        assert {s["metric"].get("lease") for s in series} == {None}, name
        assert {s["metric"]["lease_group"] for s in series} == {"jobs"}, name
    assert prom.query("leader_election_master_status") == []


def test_every_rule_evaluates_and_every_dashboard_query_returns_data(
    stack: tuple[Path, Prometheus],
) -> None:
    _, prom = stack

    def evaluated() -> list[dict[str, Any]] | None:
        rules = prom.rules()
        return rules if all(rule["health"] != "unknown" for rule in rules) else None

    for rule in poll(evaluated, 15, "every rule evaluated at least once"):
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    for rule in alerting_rules():
        prom.query(rule["expr"])  # raises with Prometheus's error message on failure
    for title, query in dashboard_queries():
        assert poll(partial(prom.query, query), 15, f"data for {title}: {query}"), title


def test_a_stalled_store_raises_the_gap_alert_per_shard_and_the_page_per_group(
    stack: tuple[Path, Prometheus],
) -> None:
    """SQLite's write lock held by another process: every leader's renewals fail. The gap
    alert names each shard with the replica leading it; the lease-lost page names each
    replica that led, the lease group, reason "deadline" and how many shards it lost."""
    db, prom = stack
    led = poll(partial(leaders, prom), 15, "4 shards led, balanced")
    lost_by = {instance: sum(1 for i in led.values() if i == instance) for instance in led.values()}
    holder = sqlite3.connect(db, isolation_level=None, timeout=10, check_same_thread=False)
    try:
        holder.execute("BEGIN EXCLUSIVE")

        def gap_alerts() -> set[tuple[str, str]] | None:
            alerts = {
                (a["labels"]["lease"], a["labels"]["instance"])
                for a in ours(prom.alerts(), GAP_ALERT)
            }
            return alerts if alerts == set(led.items()) else None

        poll(gap_alerts, 15, f"the gap alert for every shard: {led}")

        def pages() -> list[dict[str, Any]] | None:
            alerts = ours(prom.alerts(), "LeaderSidecarLeaseLost")
            counted = {
                a["labels"]["instance"]: a["annotations"]["summary"]
                for a in alerts
                if a["labels"]["reason"] == "deadline"
            }
            wanted = {
                instance: f"Lease group jobs: a leader lost {n} lease(s) (deadline)"
                for instance, n in lost_by.items()
            }
            return alerts if counted == wanted else None

        for page in poll(pages, 20, f"the lease-lost page per replica: {lost_by}"):
            assert page["labels"]["lease_group"] == "jobs"
            assert "lease" not in page["labels"]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    poll(partial(leaders, prom), 30, "every shard led again after the stall")
