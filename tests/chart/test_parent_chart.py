"""The chart as a dependency of an app's own chart, the way the README tells users to add it: a
``dependencies`` entry, a few values, and the named templates included in the app's pod spec
through ``.Subcharts``. Built with ``helm dependency build`` from a ``file://`` repository."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import CHART, KUBE_VERSIONS, Helm, containers, find, one, pod_spec, validate

# The app's Deployment, with the README's lines for the sidecar and nothing else of ours.
DEPLOYMENT = """\
{{- $ls := index .Subcharts "%(key)s" }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-payments
spec:
  replicas: 3
  selector:
    matchLabels:
      app: payments
  template:
    metadata:
      labels:
        app: payments
        {{- include "leader-sidecar.podLabels" $ls | nindent 8 }}
    spec:
      serviceAccountName: {{ include "leader-sidecar.serviceAccountName" $ls }}
      initContainers:
        {{- include "leader-sidecar.initContainers" $ls | nindent 8 }}
      containers:
        - name: payments
          image: registry.example.com/payments:1.4.2
          ports:
            - name: http
              containerPort: 8080
        {{- include "leader-sidecar.containers" $ls | nindent 8 }}
      volumes:
        - name: cache
          emptyDir: {}
        {{- include "leader-sidecar.volumes" $ls | nindent 8 }}
"""


def make_parent(root: Path, values: dict[str, Any], alias: str | None = None) -> Path:
    parent = root / "payments"
    (parent / "templates").mkdir(parents=True)
    dependency: dict[str, Any] = {
        "name": "leader-sidecar",
        "version": yaml.safe_load((CHART / "Chart.yaml").read_text())["version"],
        "repository": f"file://{CHART}",
    }
    if alias:
        dependency["alias"] = alias
    chart = {
        "apiVersion": "v2",
        "name": "payments",
        "version": "1.4.2",
        "dependencies": [dependency],
    }
    (parent / "Chart.yaml").write_text(yaml.safe_dump(chart))
    (parent / "values.yaml").write_text(yaml.safe_dump({alias or "leader-sidecar": values}))
    (parent / "templates" / "deployment.yaml").write_text(
        DEPLOYMENT % {"key": alias or "leader-sidecar"}
    )
    return parent


PARENT_VALUES: dict[str, Any] = {
    "image": {"repository": "registry.example.com/leader-sidecar", "tag": "0.1.0"},
    "lease": {"name": "payments-ledger"},
    "leaderService": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    "metrics": {"podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
}


@pytest.fixture
def rendered(helm: Helm, tmp_path: Path) -> list[dict[str, Any]]:
    parent = make_parent(tmp_path, PARENT_VALUES)
    helm.run("dependency", "build", str(parent))
    assert list((parent / "charts").glob("leader-sidecar-*.tgz"))
    return helm.template(chart=parent, release="prod", namespace="payments")


def test_the_app_gets_the_sidecar_container_next_to_its_own(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment", "prod-payments")
    assert [(field, c["name"]) for field, c in containers(deployment)] == [
        ("containers", "payments"),
        ("containers", "leader-sidecar"),
    ]
    sidecar = pod_spec(deployment)["containers"][1]
    assert sidecar["image"] == "registry.example.com/leader-sidecar:0.1.0"
    env = {v["name"]: v.get("value") for v in sidecar["env"]}
    assert env["LEADER_SIDECAR_LEASE"] == "payments-ledger"
    assert env["LEADER_SIDECAR_STORE"] == "kubernetes"
    # The app's own volume survives; the sidecar adds none with the kubernetes store.
    assert pod_spec(deployment)["volumes"] == [{"name": "cache", "emptyDir": {}}]
    assert pod_spec(deployment)["initContainers"] is None


def test_the_pod_runs_as_the_service_account_the_role_is_bound_to(
    rendered: list[dict[str, Any]],
) -> None:
    deployment = one(rendered, "Deployment", "prod-payments")
    account = one(rendered, "ServiceAccount")["metadata"]["name"]
    assert pod_spec(deployment)["serviceAccountName"] == account == "prod-leader-sidecar"
    binding = one(rendered, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "payments"}
    ]
    rules = one(rendered, "Role")["rules"]
    assert rules[0]["resourceNames"] == ["payments-ledger"]
    assert rules[1]["resourceNames"] == ["payments-ledger-candidates"]


def test_the_leader_service_and_pod_monitor_select_the_apps_pods(
    rendered: list[dict[str, Any]],
) -> None:
    labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "payments", "leader-sidecar/lease": "payments-ledger"}
    service = one(rendered, "Service", "prod-leader-sidecar-leader")
    assert service["spec"]["selector"] == {
        "leader-sidecar/lease": "payments-ledger",
        "leader-sidecar/role": "leader",
    }
    assert service["spec"]["ports"][0]["targetPort"] == "http"  # the app's named port
    monitor = one(rendered, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"leader-sidecar/lease": "payments-ledger"}
    assert one(rendered, "PrometheusRule")["spec"]["groups"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_parents_manifests_validate(rendered: list[dict[str, Any]], kube_version: str) -> None:
    unvalidated = validate(rendered, kube_version)
    assert unvalidated == ["PodMonitor", "PrometheusRule"]


def test_native_sidecar_and_an_alias_from_the_parents_values(helm: Helm, tmp_path: Path) -> None:
    """With an alias, ``.Subcharts`` is keyed by the alias and so are the values; the switch
    moves the sidecar into initContainers without touching the app's template."""
    values = {
        **PARENT_VALUES,
        "nativeSidecar": True,
        "store": {
            "type": "redis",
            "redis": {
                "url": "rediss://redis:6380/0",
                "existingSecret": "redis-auth",
                "tls": {"existingSecret": "redis-ca"},
            },
        },
        "leaderService": {"enabled": False},
    }
    parent = make_parent(tmp_path, values, alias="election")
    helm.run("dependency", "build", str(parent))
    manifests = helm.template(
        chart=parent, release="prod", namespace="payments", kube_version="1.30.0"
    )
    deployment = one(manifests, "Deployment", "prod-payments")
    placed = [(field, c["name"]) for field, c in containers(deployment)]
    assert placed == [("initContainers", "leader-sidecar"), ("containers", "payments")]
    assert pod_spec(deployment)["initContainers"][0]["restartPolicy"] == "Always"
    assert pod_spec(deployment)["volumes"] == [
        {"name": "cache", "emptyDir": {}},
        {
            "name": "leader-sidecar-redis-tls",
            "secret": {"secretName": "redis-ca", "defaultMode": 0o444},
        },
    ]
    # The alias names the objects: prod-election, consistently in the pod and the account.
    assert pod_spec(deployment)["serviceAccountName"] == "prod-election"
    assert [m["metadata"]["name"] for m in find(manifests, "ServiceAccount")] == ["prod-election"]
    assert not find(manifests, "Role")  # redis: no RBAC
    validate(manifests, "1.30.0")


def test_the_subcharts_schema_guards_the_parents_values(helm: Helm, tmp_path: Path) -> None:
    parent = make_parent(tmp_path, {**PARENT_VALUES, "lease": {"duration": "fifteen"}})
    helm.run("dependency", "build", str(parent))
    with pytest.raises(Exception, match=r"lease\.duration: Does not match pattern"):
        helm.template(chart=parent)


def test_the_readme_snippet_is_the_one_tested_here() -> None:
    """The chart README shows the same include lines this test renders."""
    readme = (CHART / "README.md").read_text()
    for line in (DEPLOYMENT % {"key": "leader-sidecar"}).splitlines():
        if "leader-sidecar." in line or ".Subcharts" in line:
            assert textwrap.dedent(line).strip() in readme, line
