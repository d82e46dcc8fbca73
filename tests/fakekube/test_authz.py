"""With an authorizer the fake authorizes like kube-apiserver's RBAC: the recorded 403s word for
word, resourceNames that limit list/watch only through ``fieldSelector=metadata.name``, create
that no name can limit, subresources that need rules of their own, and nothing else changed
when RBAC is off."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakekube import FakeApiServer, running
from tests.fakekube.authz import Authorizer, request_info
from tests.fakekube.replay import Replayer, exchange
from tests.support.rbac import Request, User, rule_allows

ALICE = "alice-token"
ADMIN = "admin-token"
SIDECAR = "sidecar-token"
SA = "system:serviceaccount:demo:leader-sidecar"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
PODS = "/api/v1/namespaces/demo/pods"
EVENTS = "/api/v1/namespaces/demo/events"
MERGE = {"Content-Type": "application/merge-patch+json"}

USERS = {
    ALICE: User.authenticated("alice"),
    ADMIN: User.authenticated("admin", ["system:masters"]),
    SIDECAR: User.service_account("demo", "leader-sidecar"),
}


def role(name: str, *rules: dict[str, Any], namespace: str = "demo") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": list(rules),
    }


def binding(
    name: str, role_name: str, *subjects: dict[str, Any], namespace: str = "demo"
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": list(subjects),
    }


# The chart's rules for a Lease called my-lease (charts/leader-sidecar/templates/rbac.yaml).
LEASE_BY_NAME = {
    "apiGroups": ["coordination.k8s.io"],
    "resources": ["leases"],
    "resourceNames": ["my-lease"],
    "verbs": ["get", "list", "watch", "update", "patch"],
}
LEASE_CREATE = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}
POD_PATCH = {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
EVENT_CREATE = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
# An unqualified service account subject means one in the binding's namespace.
SIDECAR_SUBJECT = {"kind": "ServiceAccount", "name": "leader-sidecar"}


def sidecar_rbac(*rules: dict[str, Any]) -> Authorizer:
    chosen = rules or (LEASE_BY_NAME, LEASE_CREATE, POD_PATCH, EVENT_CREATE)
    return Authorizer(
        [
            role("leader-sidecar", *chosen),
            binding("leader-sidecar", "leader-sidecar", SIDECAR_SUBJECT),
        ],
        USERS,
    )


def lease_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a_1", "leaseDurationSeconds": 2, "leaseTransitions": 1},
    }


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    async with running(authorizer=Authorizer([], USERS)) as server:
        yield server


async def call(
    fake: FakeApiServer,
    method: str,
    path: str,
    token: str | None = SIDECAR,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request; a watch is only opened (status and headers), not read."""
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body)
    if data is not None:
        all_headers.setdefault("Content-Type", "application/json")
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, fake.url + path, data=data, headers=all_headers) as response,
    ):
        if "watch=" in path and response.status == 200:
            return response.status, None
        text = await response.text()
        if not response.content_type.endswith("json"):
            return response.status, text
        return response.status, json.loads(text) if text.strip() else None


# -- RBAC's attributes of a request ------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        (
            "GET",
            f"{LEASES}/my-lease",
            {},
            Request("get", "coordination.k8s.io", "leases", "demo", "my-lease"),
        ),
        (
            "HEAD",
            f"{LEASES}/my-lease",
            {},
            Request("get", "coordination.k8s.io", "leases", "demo", "my-lease"),
        ),
        ("GET", LEASES, {}, Request("list", "coordination.k8s.io", "leases", "demo")),
        (
            "GET",
            LEASES,
            {"fieldSelector": "metadata.name=my-lease"},
            Request("list", "coordination.k8s.io", "leases", "demo", "my-lease"),
        ),
        (
            "GET",
            LEASES,
            {"watch": "true", "fieldSelector": "metadata.name==my-lease"},
            Request("watch", "coordination.k8s.io", "leases", "demo", "my-lease"),
        ),
        ("GET", LEASES, {"watch": "1"}, Request("watch", "coordination.k8s.io", "leases", "demo")),
        (
            "GET",
            LEASES,
            {"watch": "false"},
            Request("list", "coordination.k8s.io", "leases", "demo"),
        ),
        # Another field, a negation or an unparseable selector names nothing.
        (
            "GET",
            LEASES,
            {"fieldSelector": "metadata.name!=my-lease"},
            Request("list", "coordination.k8s.io", "leases", "demo"),
        ),
        (
            "GET",
            LEASES,
            {"fieldSelector": "metadata.namespace=demo,metadata.name=my-lease"},
            Request("list", "coordination.k8s.io", "leases", "demo", "my-lease"),
        ),
        (
            "GET",
            LEASES,
            {"fieldSelector": "metadata.name=my-lease,nonsense"},
            Request("list", "coordination.k8s.io", "leases", "demo"),
        ),
        ("POST", LEASES, {}, Request("create", "coordination.k8s.io", "leases", "demo")),
        ("PUT", f"{LEASES}/x", {}, Request("update", "coordination.k8s.io", "leases", "demo", "x")),
        ("PATCH", f"{PODS}/app-0", {}, Request("patch", "", "pods", "demo", "app-0")),
        (
            "DELETE",
            f"{LEASES}/x",
            {},
            Request("delete", "coordination.k8s.io", "leases", "demo", "x"),
        ),
        (
            "DELETE",
            LEASES,
            {},
            Request("deletecollection", "coordination.k8s.io", "leases", "demo"),
        ),
        (
            "PATCH",
            f"{PODS}/app-0/status",
            {},
            Request("patch", "", "pods", "demo", "app-0", "status"),
        ),
        ("POST", f"{PODS}/app-0/exec", {}, Request("create", "", "pods", "demo", "app-0", "exec")),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/leases",
            {},
            Request("list", "coordination.k8s.io", "leases", ""),
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/watch/namespaces/demo/leases/x",
            {},
            Request("watch", "coordination.k8s.io", "leases", "demo", "x"),
        ),
        (
            "POST",
            "/apis/events.k8s.io/v1/namespaces/demo/events",
            {},
            Request("create", "events.k8s.io", "events", "demo"),
        ),
        ("GET", "/api/v1/namespaces/demo", {}, Request("get", "", "namespaces", "demo", "demo")),
        ("GET", "/api/v1/namespaces", {}, Request("list", "", "namespaces", "")),
    ],
)
def test_a_request_is_seen_as_request_info_sees_it(
    method: str, path: str, query: dict[str, str], expected: Request
) -> None:
    assert request_info(method, path, query) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/version",
        "/healthz",
        "/api",
        "/api/v1",
        "/apis",
        "/apis/coordination.k8s.io",
        "/apis/coordination.k8s.io/v1",
        "/openapi/v3",
        "/",
    ],
)
def test_discovery_and_version_are_not_resource_requests(path: str) -> None:
    assert request_info("GET", path, {}) is None


def test_wildcards_and_subresource_wildcards_match_as_in_rbac() -> None:
    status = Request("patch", "", "pods", "demo", "app-0", "status")
    assert not rule_allows(POD_PATCH, status)
    assert rule_allows({**POD_PATCH, "resources": ["pods/status"]}, status)
    assert rule_allows({**POD_PATCH, "resources": ["*/status"]}, status)
    assert not rule_allows(
        {**POD_PATCH, "resources": ["*/status"]}, Request("patch", "", "pods", "demo", "x")
    )
    assert rule_allows({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, status)


# -- the recorded refusals -----------------------------------------------------------------------

ALICE_REFUSED = (
    "alice-get-lease",
    "alice-get-missing-lease",
    "alice-list-leases",
    "alice-watch-leases",
    "alice-update-lease",
    "alice-create-lease",
    "alice-patch-pod",
    "alice-create-event",  # events.k8s.io, which the fake does not serve: still a 403 first
    "alice-cluster-scope-list",
)


async def test_a_user_without_bindings_gets_the_recorded_403s(fake: FakeApiServer) -> None:
    """Every refusal in rbac.json, Status body and headers as recorded; discovery and
    /version stay open; an unknown token is a 401, no token is system:anonymous."""
    async with aiohttp.ClientSession() as session:
        replayer = Replayer(session, fake.url)
        for name in ALICE_REFUSED:
            await replayer.replay("rbac", name, token=ALICE)
        await replayer.replay("rbac", "alice-version", token=ALICE)
        await replayer.replay("rbac", "alice-api-discovery", token=ALICE)
        await replayer.replay("rbac", "bad-token", token="not-a-real-token-000000")
        await replayer.replay("rbac", "no-token", token=None)
    refused = [r for r in fake.requests if r["status"] == 403]
    assert len(refused) == len(ALICE_REFUSED) + 1
    assert all(r["rbac"]["allowed"] is False for r in refused)


async def test_the_recorded_role_and_binding_allow_alice_what_they_grant_and_no_more(
    fake: FakeApiServer,
) -> None:
    """rbac.json's Role and RoleBinding (as the admin created them) loaded into the fake:
    the get that then succeeded succeeds, with RBAC's recorded reason; delete and another
    namespace are the recorded 403s."""
    objects = [
        exchange("rbac", "admin-create-role")["request"]["body"],
        exchange("rbac", "admin-create-rolebinding")["request"]["body"],
    ]
    fake.authorizer = Authorizer(objects, USERS)
    assert (await call(fake, "POST", LEASES, ADMIN, lease_body("my-lease")))[0] == 201
    async with aiohttp.ClientSession() as session:
        replayer = Replayer(session, fake.url)
        status, _, body, _ = await replayer.send(
            exchange("rbac", "alice-get-lease-after-binding")["request"], token=ALICE
        )
        assert (status, body["metadata"]["name"]) == (200, "my-lease")
        await replayer.replay("rbac", "alice-delete-lease-after-binding", token=ALICE)
        await replayer.replay("rbac", "alice-get-lease-other-namespace", token=ALICE)
    allowed = next(r for r in fake.requests if r["user"] == "alice" and r["status"] == 200)
    ssar = exchange("rbac", "alice-ssar-after-binding")["response"]["body"]["status"]
    assert allowed["rbac"]["reason"] == ssar["reason"]


# -- resourceNames, create, subresources ----------------------------------------------------------


async def test_resource_names_limit_list_and_watch_only_through_the_field_selector(
    fake: FakeApiServer,
) -> None:
    fake.authorizer = sidecar_rbac()
    one = "fieldSelector=metadata.name%3Dmy-lease"
    assert (await call(fake, "GET", f"{LEASES}?{one}"))[0] == 200
    assert (await call(fake, "GET", f"{LEASES}?watch=true&{one}&timeoutSeconds=1"))[0] == 200
    status, body = await call(fake, "GET", LEASES)
    assert status == 403
    assert body["message"] == (
        f'leases.coordination.k8s.io is forbidden: User "{SA}" cannot list resource "leases" '
        'in API group "coordination.k8s.io" in the namespace "demo"'
    )
    status, body = await call(fake, "GET", f"{LEASES}?watch=true")
    assert (status, body["details"]) == (403, {"group": "coordination.k8s.io", "kind": "leases"})
    # Selecting another name is a request for that name, refused under that name.
    status, body = await call(fake, "GET", f"{LEASES}?fieldSelector=metadata.name%3Dother")
    assert status == 403
    assert body["message"].startswith('leases.coordination.k8s.io "other" is forbidden')
    assert (await call(fake, "GET", f"{LEASES}/other"))[0] == 403
    assert (await call(fake, "GET", f"{LEASES}/my-lease"))[0] == 404  # allowed; not there yet


async def test_create_is_never_limited_by_name(fake: FakeApiServer) -> None:
    """A rule with resourceNames cannot allow create, even for the name in the body; the
    chart's separate create rule can."""
    fake.authorizer = sidecar_rbac(LEASE_BY_NAME)
    status, body = await call(fake, "POST", LEASES, body=lease_body("my-lease"))
    assert status == 403
    assert body["message"] == (
        f'leases.coordination.k8s.io is forbidden: User "{SA}" cannot create resource "leases" '
        'in API group "coordination.k8s.io" in the namespace "demo"'
    )
    assert "name" not in body["details"]
    fake.authorizer = sidecar_rbac(LEASE_BY_NAME, LEASE_CREATE)
    assert (await call(fake, "POST", LEASES, body=lease_body("my-lease")))[0] == 201


async def test_subresources_need_rules_of_their_own(fake: FakeApiServer) -> None:
    fake.authorizer = sidecar_rbac()
    assert (await call(fake, "POST", PODS, ADMIN, pod_body("app-0")))[0] == 201
    status, _ = await call(fake, "PATCH", f"{PODS}/app-0", body={}, headers=MERGE)
    assert status == 200
    status, body = await call(fake, "PATCH", f"{PODS}/app-0/status", body={}, headers=MERGE)
    assert status == 403
    assert body["message"] == (
        f'pods "app-0" is forbidden: User "{SA}" cannot patch resource "pods/status" in API '
        'group "" in the namespace "demo"'
    )
    assert body["details"] == {"name": "app-0", "kind": "pods"}
    assert (await call(fake, "POST", f"{PODS}/app-0/exec", body={}))[0] == 403


async def test_only_what_the_role_grants_and_only_in_its_namespace(fake: FakeApiServer) -> None:
    fake.authorizer = sidecar_rbac()
    assert (await call(fake, "POST", PODS, ADMIN, pod_body("app-0")))[0] == 201
    assert (await call(fake, "GET", f"{PODS}/app-0"))[0] == 403  # patch, never read
    assert (await call(fake, "GET", PODS))[0] == 403
    assert (await call(fake, "DELETE", f"{LEASES}/my-lease"))[0] == 403
    assert (await call(fake, "PATCH", f"{EVENTS}/x", body={}, headers=MERGE))[0] == 403
    assert (await call(fake, "GET", EVENTS))[0] == 403
    status, _ = await call(fake, "POST", EVENTS, body={"metadata": {"name": "x"}})
    assert status == 422  # allowed, then refused by validation
    other = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/my-lease"
    assert (await call(fake, "GET", other))[0] == 403
    status, body = await call(fake, "GET", "/apis/coordination.k8s.io/v1/leases")
    assert status == 403
    assert body["message"].endswith("at the cluster scope")
    assert (await call(fake, "GET", "/api/v1/namespaces/demo"))[0] == 403
    for path in ("/version", "/api", "/apis/coordination.k8s.io/v1", "/healthz"):
        assert (await call(fake, "GET", path))[0] == 200, path


async def test_bindings_match_users_groups_and_service_accounts_like_rbac(
    fake: FakeApiServer,
) -> None:
    read = {**LEASE_BY_NAME, "verbs": ["get"]}
    get = f"{LEASES}/my-lease"
    assert (await call(fake, "POST", LEASES, ADMIN, lease_body("my-lease")))[0] == 201
    cases: list[tuple[dict[str, Any], int]] = [
        ({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": SA}, 200),
        ({"kind": "Group", "name": "system:serviceaccounts:demo"}, 200),
        ({"kind": "Group", "name": "system:authenticated"}, 200),
        ({"kind": "ServiceAccount", "name": "leader-sidecar", "namespace": "demo"}, 200),
        ({"kind": "ServiceAccount", "name": "leader-sidecar", "namespace": "other"}, 403),
        ({"kind": "ServiceAccount", "name": "someone-else"}, 403),
        ({"kind": "Group", "name": "system:serviceaccounts:other"}, 403),
    ]
    for subject, expected in cases:
        fake.authorizer = Authorizer(
            [role("reader", read), binding("reader", "reader", subject)], USERS
        )
        assert (await call(fake, "GET", get))[0] == expected, subject
    # The same Role bound in another namespace grants nothing here.
    fake.authorizer = Authorizer(
        [
            role("reader", read, namespace="other"),
            binding("reader", "reader", SIDECAR_SUBJECT, namespace="other"),
        ],
        USERS,
    )
    assert (await call(fake, "GET", get))[0] == 403
    assert (await call(fake, "GET", get, ADMIN))[0] == 200  # system:masters, before RBAC


async def test_a_binding_to_a_missing_role_says_so_in_the_403(fake: FakeApiServer) -> None:
    fake.authorizer = Authorizer([binding("leader-sidecar", "gone", SIDECAR_SUBJECT)], USERS)
    status, body = await call(fake, "GET", f"{LEASES}/my-lease")
    assert status == 403
    assert body["message"].endswith(
        'in the namespace "demo": RBAC: role.rbac.authorization.k8s.io "gone" not found'
    )


async def test_with_rbac_on_tokens_must_be_known_and_anonymous_is_refused(
    fake: FakeApiServer,
) -> None:
    fake.authorizer = sidecar_rbac()
    status, body = await call(fake, "GET", f"{LEASES}/my-lease", token="who-knows")
    assert (status, body["reason"]) == (401, "Unauthorized")
    status, body = await call(fake, "GET", f"{LEASES}/my-lease", token=None)
    assert status == 403
    assert 'User "system:anonymous"' in body["message"]


def test_cluster_wide_objects_are_refused_not_ignored() -> None:
    cluster_role = {**role("x"), "kind": "ClusterRole"}
    with pytest.raises(ValueError, match="Roles and RoleBindings to Roles only"):
        Authorizer([cluster_role], USERS)
    to_cluster_role = binding("x", "x", SIDECAR_SUBJECT)
    to_cluster_role["roleRef"]["kind"] = "ClusterRole"
    with pytest.raises(ValueError, match="Roles and RoleBindings to Roles only"):
        Authorizer([to_cluster_role], USERS)


# -- on and off ----------------------------------------------------------------------------------


async def test_the_control_port_turns_rbac_on_and_off() -> None:
    async with running() as fake, aiohttp.ClientSession() as session:
        get = f"{LEASES}/my-lease"
        assert (await call(fake, "GET", get))[0] == 404  # off: any token, anything goes
        assert "rbac" not in fake.requests[-1]
        objects = [
            role("leader-sidecar", LEASE_CREATE),
            binding("leader-sidecar", "leader-sidecar", SIDECAR_SUBJECT),
        ]
        users = {SIDECAR: {"name": SA}}
        async with session.put(
            fake.control_url + "/_fake/rbac", json={"objects": objects, "users": users}
        ) as response:
            assert response.status == 200
            assert (await response.json())["users"] == [SA]
        assert (await call(fake, "GET", get))[0] == 403
        assert fake.requests[-1]["user"] == SA
        async with session.put(
            fake.control_url + "/_fake/rbac", json={"objects": [{**objects[0], "kind": "Pod"}]}
        ) as response:
            assert response.status == 400
        async with session.delete(fake.control_url + "/_fake/rbac") as response:
            assert await response.json() == {"enabled": False}
        assert (await call(fake, "GET", get))[0] == 404


def pod_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1.0"}]},
    }
