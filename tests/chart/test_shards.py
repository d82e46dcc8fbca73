"""Several leases and shards: the chart passes them to the sidecar, the Role names exactly the
Leases the sidecar will use (checked against the sidecar's own expansion of --lease/--shards),
what only works with one lease is left out, and the example app works per shard."""

from __future__ import annotations

import http.server
import json
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sidecar import config
from tests.chart.helm import CHART, Helm, HelmError, Manifest, find, one, sidecar
from tests.chart.switches import EXAMPLE, SWITCHES
from tests.chart.test_render import environment, example

SHARDS = SWITCHES["shards"]  # names [jobs, billing], 4 shards, group workers


def loaded(manifests: list[Manifest]) -> config.Config:
    """The configuration the sidecar builds from the rendered environment."""
    env = environment(sidecar(example(manifests)))
    return config.load([], {**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def lease_rule(manifests: list[Manifest]) -> dict[str, Any]:
    """The rule that names the leases (the candidates Lease has a rule of its own)."""
    (rule,) = [
        rule
        for role in find(manifests, "Role")
        for rule in role["rules"]
        if rule.get("resourceNames") and "update" in rule["verbs"]
    ]
    return rule


def role_matches_the_sidecar(manifests: list[Manifest]) -> None:
    """The Role names the sidecar's leases, in its order, and its candidates Lease apart."""
    sidecar_config = loaded(manifests)
    rules = [
        rule
        for role in find(manifests, "Role")
        for rule in role["rules"]
        if rule.get("resourceNames")
    ]
    by_verbs = {tuple(rule["verbs"]): rule["resourceNames"] for rule in rules}
    assert by_verbs == {
        ("get", "list", "watch", "update", "patch"): list(sidecar_config.lease_names),
        ("get", "list", "watch", "patch"): [f"{sidecar_config.candidate_group}-candidates"],
    }


def test_shards_render_the_sidecars_variables(helm: Helm) -> None:
    env = environment(sidecar(example(helm.template(values=SHARDS))))
    assert (
        env.items()
        >= {
            "LEADER_SIDECAR_LEASE": "jobs,billing",
            "LEADER_SIDECAR_SHARDS": "4",
            "LEADER_SIDECAR_GROUP": "workers",
            "LEADER_SIDECAR_TRANSFER_TIMEOUT": "3s",
            "LEADER_SIDECAR_PRIORITY": "10",
            "LEADER_SIDECAR_REVISION": "7d9c",
        }.items()
    )
    sidecar_config = loaded(helm.template(values=SHARDS))
    assert sidecar_config.lease_names == (
        *(f"jobs-{i}" for i in range(4)),
        *(f"billing-{i}" for i in range(4)),
    )
    assert sidecar_config.candidate_group == "workers"
    assert sidecar_config.priority == 10
    assert sidecar_config.stand_back == 3.0


def test_one_lease_renders_as_before(helm: Helm) -> None:
    env = environment(sidecar(example(helm.template(values=EXAMPLE))))
    assert env["LEADER_SIDECAR_LEASE"] == "demo-leader-sidecar"
    for name in ("SHARDS", "GROUP", "TRANSFER_TIMEOUT", "PRIORITY"):
        assert f"LEADER_SIDECAR_{name}" not in env


@pytest.mark.parametrize(
    "lease",
    [
        {"names": ["jobs", "billing"], "shards": 4, "group": "workers"},
        {"names": ["jobs", "billing"]},  # no shards; the group defaults to the first name
        {"name": "jobs", "shards": "16"},
        {"name": "jobs", "shards": 1},  # one lease, jobs-0
        {},  # the release's name, the candidates named after it
    ],
    ids=["names-and-shards", "names", "one-name-16-shards", "one-shard", "defaults"],
)
def test_the_role_names_exactly_the_expanded_leases_and_the_candidates_lease(
    helm: Helm, lease: dict[str, Any]
) -> None:
    role_matches_the_sidecar(helm.template(values={**EXAMPLE, "lease": lease}))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # No shard expansion: the bare names.
        ("{{- $shards := .Values.lease.shards | int -}}", "{{- $shards := 0 -}}"),
        # The candidates Lease named after nothing but the group.
        (
            '{{- printf "%s-candidates" (include "leader-sidecar.group" .) -}}',
            '{{- printf "%s" (include "leader-sidecar.group" .) -}}',
        ),
        # Shards counted from 1.
        ("{{ $name }}-{{ $i }}", "{{ $name }}-{{ add1 $i }}"),
    ],
    ids=["no-expansion", "no-candidates", "off-by-one"],
)
def test_the_role_check_fails_when_the_helper_is_broken(
    helm: Helm, tmp_path: Path, old: str, new: str
) -> None:
    """The check above is not vacuous: break the helper in a copy of the chart and it fails."""
    chart = tmp_path / "leader-sidecar"
    shutil.copytree(CHART, chart)  # symlinks followed: a self-contained copy
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert text.count(old) == 1, old
    helpers.write_text(text.replace(old, new))
    manifests = helm.template(chart, values=SHARDS)
    with pytest.raises(AssertionError):
        role_matches_the_sidecar(manifests)


def test_with_several_leases_no_pod_label_rule_no_leader_service_no_helm_test(
    helm: Helm,
) -> None:
    """One role label cannot say which of several leases a pod leads, so the sidecar sets
    none: no pods patch, no Service selecting role=leader, no test asking GET /leader."""
    manifests = helm.template(values=SHARDS)
    assert {
        r for role in find(manifests, "Role") for rule in role["rules"] for r in rule["resources"]
    } == {
        "leases",
        "events",
    }
    assert find(manifests, "Service", "demo-leader-sidecar-leader") == []
    assert find(manifests, "Pod") == []
    # Pods are grouped by the group's name, which the metrics selectors still use.
    labels = example(manifests)["spec"]["template"]["metadata"]["labels"]
    assert labels["leader-sidecar/lease"] == "workers"
    # One shard is one lease: all of it stays.
    single = helm.template(values={**EXAMPLE, "lease": {"name": "jobs", "shards": 1}})
    assert one(single, "Service", "demo-leader-sidecar-leader")
    assert "pods" in {r for rule in one(single, "Role")["rules"] for r in rule["resources"]}


def test_a_lease_in_another_namespace_with_shards_gets_one_role_there(helm: Helm) -> None:
    """Without the pods rule the pods' namespace needs no Role at all."""
    values = {**SHARDS, "lease": {**SHARDS["lease"], "namespace": "coordination"}}
    manifests = helm.template(values=values)
    assert [r["metadata"]["namespace"] for r in find(manifests, "Role")] == ["coordination"]
    assert [b["metadata"]["namespace"] for b in find(manifests, "RoleBinding")] == ["coordination"]
    role_matches_the_sidecar(manifests)


def test_ten_thousand_leases_render_quickly_and_are_listed_by_name(helm: Helm) -> None:
    started = time.monotonic()
    manifests = helm.template(values={**EXAMPLE, "lease": {"name": "jobs", "shards": 10000}})
    assert time.monotonic() - started < 10
    names = lease_rule(manifests)["resourceNames"]
    assert len(names) == 10000
    assert "*" not in names
    role_matches_the_sidecar(manifests)


@pytest.mark.parametrize(
    ("lease", "message"),
    [
        ({"shards": 0}, "lease.shards: Must be greater than or equal to 1"),
        ({"shards": "many"}, "lease.shards: Does not match pattern"),
        ({"shards": 10001}, "lease.shards: Must be less than or equal to 10000"),
        ({"names": ["Jobs_1"]}, "lease.names.0: Does not match pattern"),
        ({"names": ["jobs", "jobs"]}, "lease.names: array items[0,1] must be unique"),
        ({"names": "jobs,billing"}, "lease.names: Invalid type. Expected: array"),
        ({"group": "Workers"}, "lease.group: Does not match pattern"),
        ({"transferTimeout": "soon"}, "lease.transferTimeout: Does not match pattern"),
    ],
)
def test_the_schema_rejects_bad_shard_values_naming_them(
    helm: Helm, lease: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(values={**EXAMPLE, "lease": lease})
    assert "values don't meet the specifications of the schema" in str(error.value)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # Helm prints the bound as 9.99999999e+08.
        ({"priority": 10**10}, "priority: Must be less than or equal to"),
        ({"revisionLabel": "pod template hash"}, "revisionLabel: Does not match pattern"),
    ],
)
def test_the_schema_rejects_bad_candidate_values(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(values={**EXAMPLE, **values})
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("lease", "message"),
    [
        (
            {"name": "jobs", "names": ["billing"]},
            "lease.name and lease.names are both set; use lease.names for several leases",
        ),
        (
            {"names": ["jobs", "billing"], "shards": 5001},
            "lease.names (2) times lease.shards (5001) makes 10002 leases; one sidecar runs at "
            "most 10000",
        ),
        (
            {"name": "jobs", "shards": "20000"},  # as text the schema checks the digits only
            "makes 20000 leases",
        ),
        (
            {"names": ["jobs", "jobs-candidates"]},
            "keeps the candidates in the Lease jobs-candidates, which is also one of the leases",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused_with_the_fix(
    helm: Helm, lease: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as error:
        helm.template(values={**EXAMPLE, "lease": lease})
    assert "leader-sidecar: " in str(error.value)
    assert message in str(error.value)


# -- the example app, per shard ------------------------------------------------------------


def app_container(manifests: list[Manifest]) -> dict[str, Any]:
    (app,) = [
        c
        for c in example(manifests)["spec"]["template"]["spec"]["containers"]
        if c["name"] == "app"
    ]
    return app


def test_the_example_asks_for_every_lease_with_shards_and_for_the_one_without(
    helm: Helm,
) -> None:
    def asks(values: dict[str, Any]) -> str:
        env = {
            v["name"]: v.get("value") for v in app_container(helm.template(values=values))["env"]
        }
        return env["SIDECAR_URL"]

    assert asks(SHARDS) == "http://127.0.0.1:4040/leases"
    assert asks({**EXAMPLE, "lease": {"name": "jobs", "shards": 1}}) == (
        "http://127.0.0.1:4040/leases"
    )
    assert asks(EXAMPLE) == "http://127.0.0.1:4040/leader"


class FakeLeases(http.server.BaseHTTPRequestHandler):
    """GET /leases as the sidecar answers it (sqlite-style lease names here, namespace/name on
    Kubernetes): holds jobs-0 (term 7) and jobs-2 (term 3), follows jobs-1. A long-poll
    whose ETag still matches is held briefly, as the sidecar holds it."""

    BODY: ClassVar[dict[str, Any]] = {
        "identity": "app-0_1a2b3c4d",
        "held": 2,
        "leases": [
            {"leader": True, "holder": "app-0_1a2b3c4d", "term": 7, "lease": "apps/jobs-0"},
            {"leader": False, "holder": "app-1_5e6f7a8b", "term": 9, "lease": "apps/jobs-1"},
            {"leader": True, "holder": "app-0_1a2b3c4d", "term": 3, "lease": "apps/jobs-2"},
        ],
        "candidates": [],
    }

    def do_GET(self) -> None:
        assert self.path == "/leases?wait=5", self.path
        if self.headers.get("If-None-Match") == '"v1"':
            time.sleep(0.2)
        body = json.dumps(self.BODY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("ETag", '"v1"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_example_works_on_each_shard_it_holds_with_that_shards_term(helm: Helm) -> None:
    """The rendered script against GET /leases: one JSON line per held shard and round,
    carrying that shard's term; nothing for the shard another replica holds."""
    script = app_container(helm.template(values=SHARDS))["args"][0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeLeases)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/leases"
    app = subprocess.Popen(
        [sys.executable, "-c", script],
        env={"SIDECAR_URL": url, "POD_NAME": "app-0", "PORT": "0"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert app.stdout is not None
        lines = []
        deadline = time.monotonic() + 20
        while len(lines) < 6:  # three rounds
            ready, _, _ = select.select([app.stdout], [], [], deadline - time.monotonic())
            assert ready, f"the app printed only {lines}"
            lines.append(json.loads(app.stdout.readline()))
    finally:
        app.kill()
        app.wait(5)
        server.shutdown()
        server.server_close()
    assert {(line["shard"], line["term"]) for line in lines} == {("jobs-0", 7), ("jobs-2", 3)}
    for line in lines:
        assert line["pod"] == "app-0"
        assert line["wrote"].startswith(line["shard"] + "/item-")
