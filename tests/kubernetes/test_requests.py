"""Each request as client-go sends it, counted in the fake API server's request log:
``Retry-After`` reported to the callers, no redirect followed, a ``401`` answered by reading
the token again (once), impersonation acting as the impersonated user."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.kubernetes.client import MAX_RETRY_AFTER, CallError, KubeApi, lease_path
from tests.fakekube import FakeApiServer, running
from tests.fakekube.authz import Authorizer
from tests.kubernetes.conftest import LEASE, NAMESPACE, StoreFactory
from tests.support.rbac import User


@pytest.mark.parametrize(
    ("fault", "retry_after"),
    [
        ({"status": 429, "retry_after": 5}, 5.0),  # API Priority and Fairness, plain text
        ({"status": 503, "retry_after": 7}, 7.0),
        ({"status": 500}, None),
        ({"status": 429, "retry_after": 86400}, MAX_RETRY_AFTER),  # bounded
    ],
)
async def test_retry_after_reaches_the_caller_as_store_unavailable(
    make_store: StoreFactory, fake: FakeApiServer, fault: dict[str, Any], retry_after: float | None
) -> None:
    fake.faults = fake.faults.parse({"errors": [fault]})
    with pytest.raises(StoreUnavailable) as refused:
        await make_store().read()
    assert refused.value.retry_after == retry_after
    if fault["status"] == 429:
        assert "Too many requests, please try again later." in str(refused.value)


async def test_a_redirect_is_not_followed_and_the_other_host_hears_nothing(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    """A misrouted load balancer must not send our token (or certificate) to another host."""
    async with running() as elsewhere:
        fake.faults = fake.faults.parse({"redirect": {"location": elsewhere.url, "status": 307}})
        with pytest.raises(StoreUnavailable, match="redirects are not followed"):
            await make_store().read()
        assert elsewhere.requests == []
    assert [r["status"] for r in fake.requests] == [307]


def token_kubeconfig(path: Path, server: str, token_file: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: c\n  cluster: {{server: '{server}'}}\n"
        "contexts:\n- name: c\n  context: {cluster: c, user: u}\n"
        f"users:\n- name: u\n  user: {{tokenFile: '{token_file}'}}\n"
    )
    return path


async def test_a_401_reads_the_token_file_again_and_retries_once(tmp_path: Path) -> None:
    """A token rotated since the last read (the kubelet rotates them about hourly) costs one
    refused request, not up to a minute of them."""
    token = tmp_path / "token"
    token.write_text("old\n")
    async with running(tokens={"new"}) as fake:
        api = KubeApi(str(token_kubeconfig(tmp_path / "kc", fake.url, token)), 2.0)
        try:
            with pytest.raises(CallError) as refused:  # the file still holds the old token
                await api.request("list leases", "GET", lease_path(NAMESPACE))
            assert refused.value.status == 401
            assert [r["status"] for r in fake.requests] == [401]  # no retry: nothing changed
            token.write_text("new\n")
            listed = await api.request("list leases", "GET", lease_path(NAMESPACE))
        finally:
            await api.close()
        assert listed["kind"] == "LeaseList"
        assert [r["status"] for r in fake.requests] == [401, 401, 200]


async def test_impersonation_makes_every_request_act_as_that_user(tmp_path: Path) -> None:
    """An admin's kubeconfig with ``as: alice``: the requests are alice's, and RBAC grants
    them by alice's Role, not the admin's."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "read-leases", "namespace": NAMESPACE},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["list"]}],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "alice", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-leases"},
        "subjects": [{"kind": "User", "name": "alice"}],
    }
    users = {"admin-token": User.authenticated("admin", ["system:masters"])}
    async with running(authorizer=Authorizer([role, binding], users)) as fake:
        config = tmp_path / "kc"
        config.write_text(
            textwrap.dedent(f"""\
                apiVersion: v1
                kind: Config
                current-context: c
                clusters: [{{name: c, cluster: {{server: "{fake.url}"}}}}]
                contexts: [{{name: c, context: {{cluster: c, user: admin}}}}]
                users:
                - name: admin
                  user:
                    token: admin-token
                    as: alice
                    as-groups: [team-a]
                    as-user-extra: {{reason: [on-call]}}
                """)
        )
        api = KubeApi(str(config), 2.0)
        try:
            listed = await api.request("list leases", "GET", lease_path(NAMESPACE))
            with pytest.raises(CallError) as refused:  # alice may list, not get
                await api.request("get lease", "GET", lease_path(NAMESPACE, LEASE))
        finally:
            await api.close()
    assert listed["kind"] == "LeaseList"
    assert refused.value.status == 403
    assert 'User "alice" cannot get' in refused.value.message
    assert {(r["user"], r["impersonated_by"]) for r in fake.requests} == {("alice", "admin")}
    assert fake.requests[0]["impersonation"]["groups"] == ["team-a"]
    assert fake.requests[0]["impersonation"]["extra"] == {"reason": ["on-call"]}
