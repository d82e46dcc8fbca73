"""Names Kubernetes accepts, whatever fullnameOverride says: every object the chart makes is
named within 63 characters (a Service name is a DNS label; Helm's `trunc 63 | trimSuffix "-"`
applied to the full name before a suffix), and every reference to such a name (a RoleBinding's
Role, the helm test's Services) names the object that is made."""

from __future__ import annotations

import re

import pytest

from tests.chart.helm import Helm, Manifest, find, one
from tests.chart.switches import SWITCHES

# 60 characters: "-dashboard", "-test-replicas" and every other suffix would push it past 63.
OVERRIDE = "payments-ledger-reconciliation-" + "x" * 28 + "z"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def with_override(helm: Helm, switch: str, override: str = OVERRIDE) -> list[Manifest]:
    return helm.template(values={**SWITCHES[switch], "fullnameOverride": override})


def test_the_override_is_sixty_characters() -> None:
    assert len(OVERRIDE) == 60


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_every_name_the_chart_makes_stays_within_63_characters(helm: Helm, switch: str) -> None:
    """In every switch, with a 60-character fullnameOverride: each name is a DNS label of at
    most 63 characters, and no two objects of a kind in one namespace were cut to one name."""
    manifests = with_override(helm, switch)
    named = [(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in manifests]
    assert named
    assert [n for n in named if len(n[2]) > 63] == []
    assert [n for n in named if not DNS_LABEL.match(n[2])] == []
    assert len(set(named)) == len(named)


def test_a_cut_name_keeps_its_suffix_and_the_start_of_the_override(helm: Helm) -> None:
    """`…-leader`, `…-metrics`: what an operator greps for survives the cut."""
    manifests = with_override(helm, "everything")
    dashboard = one(manifests, "ConfigMap")["metadata"]["name"]
    assert dashboard == OVERRIDE[: 63 - len("-dashboard")].rstrip("-") + "-dashboard"
    example = one(manifests, "Deployment")["metadata"]["name"]
    assert example == OVERRIDE[: 63 - len("-example")] + "-example"
    # The full name alone fits, so objects named by it are not cut.
    assert one(manifests, "PrometheusRule")["metadata"]["name"] == OVERRIDE


@pytest.mark.parametrize("override", [OVERRIDE, "x" * 63, "demo"], ids=["60", "63", "short"])
def test_references_name_the_objects_that_are_made(helm: Helm, override: str) -> None:
    """A RoleBinding binds a Role that is rendered; the helm test asks Services that are
    rendered (the replicas' headless Service, the leader Service)."""
    manifests = with_override(helm, "everything", override) + with_override(
        helm, "example", override
    )
    roles = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in find(manifests, "Role")}
    bindings = find(manifests, "RoleBinding")
    assert bindings
    for binding in bindings:
        assert (binding["metadata"]["namespace"], binding["roleRef"]["name"]) in roles
    services = {m["metadata"]["name"] for m in find(manifests, "Service")}
    for pod in find(manifests, "Pod"):
        args = pod["spec"]["containers"][0]["args"]
        flags = ("--service", "--replicas-dns")
        asked = [args[i + 1] for i, arg in enumerate(args) if arg in flags]
        assert len(asked) == 2, args[1:]
        for address in asked:
            assert address.split(".", 1)[0] in services, (address, services)
