"""The PromQL we ship — alert expressions and dashboard queries — as plain query strings, and
the metric names each one reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app_check import CHECK_OUTCOMES
from sidecar.metrics import AppMetrics, Metrics

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "sidecar" / "prometheus" / "rules.yaml"
DASHBOARD = REPO / "sidecar" / "prometheus" / "dashboard.json"

# Our metric names (label names and PromQL functions never start like this).
METRIC_NAME = re.compile(r"\b(leader_(?:sidecar|election)_[a-zA-Z0-9_]+)\b")
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
# Grafana's built-in variables, and what a query with them means for a test.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def alerting_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows themselves excluded."""
    found: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's template variables replaced, as Grafana would before sending the query."""
    return VARIABLE.sub(lambda m: values[m.group(1)], expr)


def dashboard_queries(**values: str) -> list[tuple[str, str]]:
    """(panel title / refId, query) for every panel target, with "All" selected for every
    dashboard variable unless ``values`` says otherwise."""
    variables = {v["name"]: v.get("allValue") or ".*" for v in dashboard()["templating"]["list"]}
    merged = {**BUILTINS, **variables, **values}
    return [
        (f"{panel['title']} / {target['refId']}", substitute(target["expr"], merged))
        for panel in panels()
        for target in panel["targets"]
    ]


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


class _OnHold:
    """A lease on an operator's hold, as its elector shows it at scrape time."""

    def is_leader(self) -> bool:
        return False

    def seconds_since_renewal(self) -> float:
        return 0.0

    def hold_shown(self) -> tuple[float, float] | None:
        return 10.0, 3600.0


def exported_series_names() -> set[str]:
    """Every series name a sidecar exports (histograms as _bucket/_sum/_count)."""
    registry = CollectorRegistry()
    metrics = Metrics(registry, "default", 15.0)
    metrics.store_request("renew", "ok", 0.001)  # the latency histogram appears on first use
    metrics.bind(_OnHold())  # the hold's series appear only for a lease on hold
    AppMetrics(registry, lambda: True, lambda: 0.0, CHECK_OUTCOMES, "default")  # an app check
    text = generate_latest(registry).decode()
    return {
        sample.name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
