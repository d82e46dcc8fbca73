"""The rendered RBAC grants the Kubernetes store exactly what it needs — its Lease (by name where
Kubernetes allows it), pods patch for the role labels, core Events create — and nothing
else, in every switch. Checked two ways: the rules as data, and a small evaluator of RBAC's
matching rules asked the questions the API server would ask."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.chart.helm import Helm, Manifest, find, one
from tests.chart.switches import SWITCHES
from tests.support.rbac import Request, allowed

LEASES = ("coordination.k8s.io", "leases")
PODS = ("", "pods")
EVENTS = ("", "events")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def rbac(helm: Helm, switch: str) -> tuple[list[Manifest], list[Manifest]]:
    manifests = helm.template(values=SWITCHES[switch])
    return find(manifests, "Role"), find(manifests, "RoleBinding")


def grants(roles: list[Manifest]) -> set[tuple[str, str, str, str, str]]:
    """Every (namespace, group, resource, verb, resourceName or '*') a set of Roles grants."""
    out = set()
    for role in roles:
        for rule in role["rules"]:
            for group, resource, verb, name in itertools.product(
                rule["apiGroups"],
                rule["resources"],
                rule["verbs"],
                rule.get("resourceNames") or ["*"],
            ):
                out.add((role["metadata"]["namespace"], group, resource, verb, name))
    return out


def needed(
    lease_namespace: str, lease: str, pod_namespace: str
) -> set[tuple[str, str, str, str, str]]:
    return {
        *(
            (lease_namespace, *LEASES, verb, name)
            for verb in ("get", "list", "watch", "update", "patch")
            for name in (lease,)
        ),
        # The group's candidates (one annotation per replica, merge-patched): read, watch
        # (list and watch with fieldSelector=metadata.name=<lease>-candidates) and patch.
        *(
            (lease_namespace, *LEASES, verb, f"{lease}-candidates")
            for verb in ("get", "list", "watch", "patch")
        ),
        (lease_namespace, *LEASES, "create", "*"),
        (pod_namespace, *PODS, "patch", "*"),
        # Events are recorded on the Lease, so next to it.
        (lease_namespace, *EVENTS, "create", "*"),
    }


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_no_switch_grants_anything_cluster_wide_or_by_wildcard(helm: Helm, switch: str) -> None:
    manifests = helm.template(values=SWITCHES[switch])
    assert not find(manifests, "ClusterRole")
    assert not find(manifests, "ClusterRoleBinding")
    for role in find(manifests, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"wildcard in {field}"
            assert "nonResourceURLs" not in rule


def test_the_role_grants_exactly_what_the_kubernetes_store_needs(helm: Helm) -> None:
    roles, _ = rbac(helm, "example")
    assert grants(roles) == needed("apps", "demo-leader-sidecar", "apps")


def test_a_lease_in_another_namespace_gets_its_rules_there_and_only_there(helm: Helm) -> None:
    roles, bindings = rbac(helm, "lease-in-another-namespace")
    assert grants(roles) == needed("coordination", "payments", "apps")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["apps", "coordination"]
    # Both bindings bind the pods' ServiceAccount, which lives in the release namespace.
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "demo-leader-sidecar", "namespace": "apps"}
        ]


@pytest.mark.parametrize("switch", ["example", "lease-in-another-namespace", "everything"])
def test_what_the_sidecar_does_is_allowed(helm: Helm, switch: str) -> None:
    roles, _ = rbac(helm, switch)
    values: dict[str, Any] = SWITCHES[switch]
    lease = values.get("lease", {}).get("name", "demo-leader-sidecar")
    lease_ns = values.get("lease", {}).get("namespace", "apps")
    for request in (
        Request("get", *LEASES, lease_ns, lease),
        Request("list", *LEASES, lease_ns, lease),  # with fieldSelector=metadata.name=<lease>
        Request("watch", *LEASES, lease_ns, lease),
        Request("create", *LEASES, lease_ns),
        Request("update", *LEASES, lease_ns, lease),
        Request("patch", *LEASES, lease_ns, lease),
        Request("get", *LEASES, lease_ns, f"{lease}-candidates"),
        Request("list", *LEASES, lease_ns, f"{lease}-candidates"),
        Request("watch", *LEASES, lease_ns, f"{lease}-candidates"),
        Request("patch", *LEASES, lease_ns, f"{lease}-candidates"),
        Request("patch", *PODS, "apps", "demo-leader-sidecar-example-7d9c-aaaaa"),
        Request("create", "", "events", lease_ns),
    ):
        assert allowed(roles, request), request


@pytest.mark.parametrize("switch", ["example", "lease-in-another-namespace", "everything"])
def test_everything_else_is_forbidden(helm: Helm, switch: str) -> None:
    roles, _ = rbac(helm, switch)
    values: dict[str, Any] = SWITCHES[switch]
    lease = values.get("lease", {}).get("name", "demo-leader-sidecar")
    lease_ns = values.get("lease", {}).get("namespace", "apps")
    forbidden = [
        # Other leases: e.g. kube-controller-manager's or another app's.
        *(Request(v, *LEASES, lease_ns, "someone-else") for v in ("get", "update", "patch")),
        Request("list", *LEASES, lease_ns),  # an unfiltered list of every lease
        Request("watch", *LEASES, lease_ns),
        Request("delete", *LEASES, lease_ns, lease),
        Request("deletecollection", *LEASES, lease_ns),
        Request("get", *LEASES, "kube-system", lease),
        # The candidates Lease is read, watched and merge-patched, never replaced or deleted.
        *(Request(v, *LEASES, lease_ns, f"{lease}-candidates") for v in ("update", "delete")),
        # Pods: no list/watch/delete/create, nothing in other namespaces, no subresources.
        *(Request(v, *PODS, "apps") for v in ("list", "watch", "create", "deletecollection")),
        Request("delete", *PODS, "apps", "demo-leader-sidecar-example-7d9c-x2x4q"),
        Request("patch", *PODS, "kube-system", "etcd-0"),
        Request("create", "", "pods/exec", "apps", "demo-leader-sidecar-example-7d9c-x2x4q"),
        Request("patch", "", "pods/status", "apps", "demo-leader-sidecar-example-7d9c-x2x4q"),
        Request("get", "", "secrets", "apps", "redis-auth"),
        Request("get", "", "configmaps", "apps", "x"),
        Request("list", "", "events", "apps"),
        Request("delete", "events.k8s.io", "events", "apps", "x"),
        # Nothing the sidecar does not do: it never reads pods or updates Events.
        Request("get", *PODS, "apps", "demo-leader-sidecar-example-7d9c-x2x4q"),
        Request("patch", "", "events", lease_ns, "payments.1872a"),
        Request("create", "events.k8s.io", "events", lease_ns),
        Request("patch", "apps", "deployments", "apps", "demo-leader-sidecar-example"),
    ]
    for request in forbidden:
        assert not allowed(roles, request), request
    # The evaluator is not vacuous: every verb on the lease itself is allowed but delete.
    assert {v for v in VERBS if allowed(roles, Request(v, *LEASES, lease_ns, lease))} == {
        "get",
        "list",
        "watch",
        "update",
        "patch",
        "create",
    }


def test_the_binding_names_the_pods_service_account(helm: Helm) -> None:
    manifests = helm.template(values=SWITCHES["existing-service-account"])
    assert not find(manifests, "ServiceAccount")
    binding = one(manifests, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "payments", "namespace": "apps"}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "demo-leader-sidecar",
    }
    pods = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pods["serviceAccountName"] == "payments"


def test_rbac_can_be_left_to_the_user(helm: Helm) -> None:
    roles, bindings = rbac(helm, "no-rbac-no-leader-service")
    assert roles == []
    assert bindings == []
