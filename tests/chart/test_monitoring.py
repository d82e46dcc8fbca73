"""Monitoring objects: the PrometheusRule *is* sidecar/prometheus/rules.yaml (one source, through
a symlink Helm follows, also into a packaged chart), the dashboard ConfigMap carries
sidecar/prometheus/dashboard.json, and the PodMonitor/ServiceMonitor select the right pods
and port. kubernetes-validate has no schemas for these CRDs, hence the checks here."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import CHART, Helm, Manifest, one, sidecar
from tests.chart.switches import DASHBOARD_SOURCE, SWITCHES
from tests.support.tools import REPO, require_binary

RULES_SOURCE = REPO / "sidecar" / "prometheus" / "rules.yaml"

ONE_SOURCE = [("rules.yaml", RULES_SOURCE), ("dashboard.json", DASHBOARD_SOURCE)]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def example_pod_labels(manifests: list[Manifest]) -> dict[str, str]:
    labels: dict[str, str] = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(("name", "source"), ONE_SOURCE, ids=[n for n, _ in ONE_SOURCE])
def test_the_chart_files_are_symlinks_to_the_one_source(name: str, source: Path) -> None:
    """Not copies: Helm reads files only inside the chart, so files/ links to the source."""
    if not source.exists():
        pytest.skip(f"{source.relative_to(REPO)} is not written yet")
    link = CHART / "files" / name
    assert link.is_symlink(), f"{link} must be a symlink to {source}"
    assert link.resolve() == source.resolve()


def test_the_prometheus_rule_spec_equals_the_rules_file(helm: Helm) -> None:
    manifests = helm.template(values=SWITCHES["prometheus-rule"])
    rule = one(manifests, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES_SOURCE.read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == "apps"


def test_runbooks_url_moves_every_runbook_link_to_that_page(helm: Helm) -> None:
    """Runbooks kept in a fork or a wiki: each alert's runbook_url is that page plus the
    alert's anchor; nothing else of the spec changes."""
    page = "https://wiki.example.com/sre/leader-sidecar"
    switch = SWITCHES["prometheus-rule"]["prometheusRule"]
    values = {"prometheusRule": {**switch, "runbooksUrl": page}}
    spec = one(helm.template(values=values), "PrometheusRule")["spec"]
    source = yaml.safe_load(RULES_SOURCE.read_text())
    rules = [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]
    assert len(rules) >= 7
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{page}#{rule['alert'].lower()}"
    for group in source["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = f"{page}#{rule['alert'].lower()}"
    assert spec == source


def test_promtool_accepts_the_rendered_rules(helm: Helm, tmp_path: Path) -> None:
    """What the Prometheus operator would load: the rendered spec as a rule file."""
    spec = one(helm.template(values=SWITCHES["prometheus-rule"]), "PrometheusRule")["spec"]
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(rendered)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in spec["groups"])
    assert count > 0
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_a_packaged_chart_carries_the_files_not_the_links(helm: Helm, tmp_path: Path) -> None:
    """``helm package`` (what a chart repository or a parent's ``dependency build`` gets)
    follows the links: the archive holds regular files identical to the sources, and renders
    the same PrometheusRule."""
    helm.run("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("leader-sidecar-*.tgz")
    with tarfile.open(archive) as tar:
        for name, source in ONE_SOURCE:
            if not source.exists():
                continue
            member = tar.getmember(f"leader-sidecar/files/{name}")
            assert member.isfile(), f"{name} is not a regular file in the package"
            extracted = tar.extractfile(member)
            assert extracted is not None
            assert extracted.read() == source.read_bytes()
    packaged = helm.template(chart=archive, values=SWITCHES["prometheus-rule"])
    assert one(packaged, "PrometheusRule")["spec"] == yaml.safe_load(RULES_SOURCE.read_text())


def test_the_dashboard_config_map_carries_the_dashboard_for_grafanas_sidecar(helm: Helm) -> None:
    if not DASHBOARD_SOURCE.exists():
        pytest.skip("sidecar/prometheus/dashboard.json is not written yet")
    manifests = helm.template(values=SWITCHES["dashboard"])
    config_map = one(manifests, "ConfigMap", "demo-leader-sidecar-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Leader election"}
    data: dict[str, Any] = config_map["data"]
    assert list(data) == ["leader-sidecar.json"]
    assert json.loads(data["leader-sidecar.json"]) == json.loads(DASHBOARD_SOURCE.read_text())


def test_the_pod_monitor_scrapes_the_sidecar_port_of_every_pod_of_the_lease(helm: Helm) -> None:
    manifests = helm.template(values=SWITCHES["pod-monitor"])
    monitor = one(manifests, "PodMonitor")
    assert monitor["metadata"]["labels"]["team"] == "a"
    labels = example_pod_labels(manifests)
    assert matches(monitor["spec"]["selector"]["matchLabels"], labels)
    # Followers are scraped too: the selector does not involve the role label.
    assert "leader-sidecar/role" not in monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "sidecar-public", "path": "/metrics", "interval": "15s"}
    ports = {p["name"] for p in sidecar(one(manifests, "Deployment"))["ports"]}
    assert endpoint["port"] in ports


def test_the_service_monitor_reaches_every_pod_through_a_headless_service(helm: Helm) -> None:
    manifests = helm.template(values=SWITCHES["service-monitor"])
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service", "demo-leader-sidecar-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    # Not the leader Service: that one would let Prometheus see the leader only.
    leader = one(manifests, "Service", "demo-leader-sidecar-leader")
    assert not matches(monitor["spec"]["selector"]["matchLabels"], leader["metadata"]["labels"])
    assert matches(service["spec"]["selector"], example_pod_labels(manifests))
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": "sidecar-public",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "5s",
    }
    (port,) = service["spec"]["ports"]
    assert port["name"] == endpoint["port"]
    assert port["targetPort"] in {p["name"] for p in sidecar(one(manifests, "Deployment"))["ports"]}


@pytest.mark.parametrize(
    ("per_lease", "env"),
    [("", None), (True, "true"), (False, "false")],
    ids=["default", "true", "false"],
)
def test_metrics_per_lease_reaches_the_sidecar_false_included(
    helm: Helm, per_lease: object, env: str | None
) -> None:
    """`metrics.perLease`: "" leaves the sidecar's default (per lease without shards), and
    `false` is set as false, not dropped as an empty value."""
    values = {**SWITCHES["many-shards"], "metrics": {"perLease": per_lease}}
    container = sidecar(one(helm.template(values=values), "Deployment"))
    found = {e["name"]: e.get("value") for e in container["env"]}
    assert found.get("LEADER_SIDECAR_METRICS_PER_LEASE") == env
