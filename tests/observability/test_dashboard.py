"""The Grafana dashboard: a well-formed, importable dashboard whose every query is valid PromQL
over metrics the sidecar exports, and that shows what the issue promises (leader per lease,
term, renewal gaps against half the lease, seconds since renewal, transitions, demotions by
reason, store latency and outcomes). The end-to-end test runs the same queries against a real
Prometheus scraping real sidecars."""

from __future__ import annotations

import itertools
import subprocess
from importlib import resources
from pathlib import Path

import yaml

from tests.observability.promql import (
    BUILTINS,
    VARIABLE,
    dashboard,
    dashboard_queries,
    exported_series_names,
    metric_names,
    panels,
)
from tests.support.tools import require_binary


def test_the_dashboard_is_importable_as_is() -> None:
    """A fixed uid, a data source variable (no hard-wired data source), and every panel
    querying through that variable."""
    board = dashboard()
    assert board["uid"] == "leader-sidecar"
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].strip()
        assert panel.get("description"), f"{panel['title']}: say what the panel means"


def test_panel_ids_are_unique_and_the_grid_has_no_overlaps() -> None:
    """Grafana lays out by gridPos: 24 columns, no two panels on the same cells."""
    every = dashboard()["panels"]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x, y in itertools.product(
            range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        ):
            assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
            cells[(x, y)] = panel["title"]


def test_queries_use_only_defined_variables() -> None:
    """A typo in a variable name would send a literal ``$lease`` to Prometheus."""
    defined = {v["name"] for v in dashboard()["templating"]["list"]} | set(BUILTINS)
    for panel in panels():
        for target in panel["targets"]:
            used = set(VARIABLE.findall(target["expr"]))
            assert used <= defined, (panel["title"], used - defined)
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            assert set(VARIABLE.findall(variable["definition"])) <= defined


def test_queries_read_only_metrics_the_sidecar_exports() -> None:
    """A renamed metric would leave a panel silently empty."""
    exported = exported_series_names()
    for title, query in dashboard_queries():
        used = metric_names(query)
        assert used, title
        assert used <= exported, (title, used - exported)
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            assert metric_names(variable["definition"]) <= exported


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule), variables substituted."""
    promtool = require_binary("promtool")
    rules = [
        {"record": f"dashboard:query_{index}", "expr": query}
        for index, (_, query) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_shows_what_the_issue_promises() -> None:
    """Each promised view has a panel reading the metric behind it."""
    queries = "\n".join(query for _, query in dashboard_queries())
    for metric in (
        "leader_sidecar_is_leader",
        "leader_sidecar_term",
        "leader_sidecar_renewal_gap_seconds_bucket",
        "leader_sidecar_since_renewal_seconds",
        "leader_sidecar_transitions_total",
        "leader_sidecar_demotions_total",
        "leader_sidecar_store_request_duration_seconds_bucket",
        "leader_sidecar_store_requests_total",
    ):
        assert metric in queries, metric
    by_type = {panel["type"] for panel in panels()}
    assert {"heatmap", "state-timeline", "timeseries", "stat"} <= by_type
    # The gap quantiles are drawn against half the lease.
    (quantiles,) = [p for p in panels() if "quantiles" in p["title"]]
    exprs = [target["expr"] for target in quantiles["targets"]]
    assert any("histogram_quantile(0.99" in expr for expr in exprs)
    assert any(
        "leader_sidecar_lease_duration_seconds" in expr and expr.endswith("/ 2") for expr in exprs
    )
    (demotions,) = [p for p in panels() if "Demotions" in p["title"]]
    assert "reason" in demotions["targets"][0]["expr"]


def test_the_dashboard_ships_inside_the_package() -> None:
    """Next to the rules: ``sidecar/prometheus/dashboard.json``."""
    shipped = resources.files("sidecar").joinpath("prometheus", "dashboard.json")
    assert shipped.is_file()
