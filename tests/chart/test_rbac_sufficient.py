"""The chart's Role is enough for a real run, and no more than it needs: ``helm template``
renders the Role(s), RoleBinding(s) and the sidecar container's environment; the fake API
server enforces that RBAC for the service account's token; three real ``leader-sidecar``
processes run with the rendered environment against it. They elect, hand off on SIGTERM,
relabel the pods and record Events without a single 401/403, and every rule the chart grants
is used. The negative control takes one rule away and sees the 403s and the sidecar's hint,
so the positive run cannot pass by enforcing nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.backends.kubernetes.client import RBAC_FIX
from tests.chart.helm import Helm, Manifest, find, one, pod_spec, sidecar
from tests.chart.switches import SWITCHES
from tests.fakekube import FakeKubeProcess, fake_kube_process, kubeconfig
from tests.support.sidecars import SidecarProcess, by_name, observing, signal_leader
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

RELEASE_NAMESPACE = "apps"  # helm template's --namespace in tests.chart.helm: the pods' namespace
PODS = ("app-0", "app-1", "app-2")
LEASE = 2.0  # seconds: the chart's 15 s would make the test slow, and RBAC does not care
TOKEN = "token-of-the-sidecars-service-account"
REFUSED = "the Kubernetes API refused this request (RBAC)"


@dataclasses.dataclass(frozen=True)
class Rendered:
    """What the chart renders for the Kubernetes store, as the sidecar would see it."""

    rbac: list[Manifest]  # Roles and RoleBindings
    env: dict[str, str]  # the container's environment, fieldRefs resolved except POD_NAME
    args: list[str]
    user: str  # the service account the pods run as, as the API server names it

    @property
    def lease(self) -> str:
        return self.env["LEADER_SIDECAR_LEASE"]

    @property
    def lease_namespace(self) -> str:
        return self.env.get("LEADER_SIDECAR_NAMESPACE", RELEASE_NAMESPACE)

    @property
    def label_key(self) -> str:
        return self.env["LEADER_SIDECAR_ROLE_LABEL_KEY"]


def render(helm: Helm, switch: str) -> Rendered:
    manifests = helm.template(values=SWITCHES[switch], namespace=RELEASE_NAMESPACE)
    workload = one(manifests, "Deployment")
    container = sidecar(workload)
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        # Anything but the downward API is an input this test does not know how to give.
        assert "fieldRef" in item.get("valueFrom", {}), item
        field = item["valueFrom"]["fieldRef"]["fieldPath"]
        if field == "metadata.namespace":
            env[item["name"]] = RELEASE_NAMESPACE
        elif item["name"] == "LEADER_SIDECAR_REVISION":
            assert field == "metadata.labels['pod-template-hash']", item
            env[item["name"]] = "7d9c"
        elif item["name"] == "POD_IP":  # only a health URL may name it
            assert field == "status.podIP", item
            env[item["name"]] = "10.0.1.7"
        else:
            assert (item["name"], field) == ("POD_NAME", "metadata.name"), item
    assert env["LEADER_SIDECAR_STORE"] == "kubernetes"
    account = pod_spec(workload)["serviceAccountName"]
    return Rendered(
        rbac=find(manifests, "Role") + find(manifests, "RoleBinding"),
        env=env,
        args=[str(arg) for arg in container.get("args") or []],
        user=f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}",
    )


def without(rbac: list[Manifest], group: str, resource: str, verb: str) -> list[Manifest]:
    """The same objects with one verb taken out of every Role rule that grants it."""
    out = []
    for obj in json.loads(json.dumps(rbac)):
        if obj["kind"] == "Role":
            rules = []
            for rule in obj["rules"]:
                if group in rule["apiGroups"] and resource in rule["resources"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
                if rule["verbs"]:
                    rules.append(rule)
            obj["rules"] = rules
        out.append(obj)
    assert out != rbac, f"no rule grants {verb} on {resource}"
    return out


@contextlib.contextmanager
def enforcing(chart: Rendered, rbac: list[Manifest]) -> Iterator[FakeKubeProcess]:
    """A fake API server with the pods and namespaces, enforcing ``rbac`` for the token."""
    with fake_kube_process() as fake:
        for namespace in {RELEASE_NAMESPACE, chart.lease_namespace}:
            fake.control("POST", "/_fake/namespaces", {"name": namespace})
        for name in PODS:
            fake.create_pod(RELEASE_NAMESPACE, name)
        fake.set_rbac(rbac, {TOKEN: {"name": chart.user}})
        fake.clear_requests()
        yield fake


@contextlib.contextmanager
def three_sidecars(
    fake: FakeKubeProcess, chart: Rendered, tmp_path: Path
) -> Iterator[list[SidecarProcess]]:
    """The rendered environment; only what cannot be the same outside a pod is changed: the
    listeners (port 0), the lease duration, debug logs, and a kubeconfig carrying the service
    account's token instead of the mounted one."""
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(fake.url, chart.lease_namespace, token=TOKEN))
    procs: list[SidecarProcess] = []
    try:
        for name in PODS:
            procs.append(
                SidecarProcess.start(
                    name,
                    "kubernetes",
                    lease_duration=f"{LEASE:g}s",
                    args=["--kubeconfig", str(config), *chart.args],
                    env={**chart.env, "POD_NAME": name},
                )
            )
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def role_labels(fake: FakeKubeProcess, chart: Rendered) -> dict[str, str | None]:
    return {name: fake.pod_labels(RELEASE_NAMESPACE, name).get(chart.label_key) for name in PODS}


def event_messages(fake: FakeKubeProcess, chart: Rendered) -> list[str]:
    selector = f"involvedObject.kind=Lease,involvedObject.name={chart.lease}"
    return [event["message"] for event in fake.events(chart.lease_namespace, selector)]


def granted(rbac: list[Manifest]) -> set[tuple[str, str, str, str]]:
    """(namespace, group, resource, verb) for every verb a Role grants."""
    return {
        (role["metadata"]["namespace"], group, resource, verb)
        for role in rbac
        if role["kind"] == "Role"
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("switch", ["example", "lease-in-another-namespace"])
async def test_the_charts_role_is_enough_for_election_hand_off_labels_and_events(
    helm: Helm, tmp_path: Path, switch: str
) -> None:
    chart = render(helm, switch)
    with enforcing(chart, chart.rbac) as fake, three_sidecars(fake, chart, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            await eventually(lambda: role_labels(fake, chart)[first.name] == "leader")
            for proc in procs:  # each has seen the leader, so the successor can name it
                await observer.wait_for(
                    lambda s, name=proc.name: (
                        s.name == name and s.body is not None and s.body["holder"] == first.identity
                    ),
                    timeout=5,
                )
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            successor = handover.successor
            assert handover.leader.wait_exit(3.0) == 0
            await eventually(
                lambda: (
                    role_labels(fake, chart)
                    == {
                        name: {first.name: "follower", successor.name: "leader"}.get(name)
                        for name in PODS
                    }
                )
            )
            wanted = (
                f"{first.identity} became leader (term {first.term}; previous holder: none)",
                f"{first.identity} stopped leading (term {first.term}): released on shutdown",
                f"{successor.identity} became leader (term {successor.term}; previous holder: "
                f"{first.identity})",
            )
            await eventually(lambda: set(wanted) <= set(event_messages(fake, chart)))
            # The hand-over granted the successor in its own write (a PATCH). A plain release
            # (POST /leader/release) lets the third replica take the lease with a grant of its
            # own: a PUT, which the Role must allow too.
            third = next(p for p in procs if p.name not in (first.name, successor.name))
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    by_name(procs, successor.name).leader_url + "/release", json={}
                ) as answer,
            ):
                assert answer.status == 200
            await observer.wait_for(lambda s: s.name == third.name and s.leader, timeout=10)
        requests = await asyncio.to_thread(fake.requests)

    sidecars = [r for r in requests if r["user_agent"].startswith("leader-sidecar/")]
    assert sidecars
    assert {r["user"] for r in sidecars} == {chart.user}  # every one with the token
    refused = [r for r in sidecars if r["status"] in (401, 403)]
    assert refused == [], refused[:5]
    # Every grant was used: the Role asks for nothing the sidecar does not do.
    used = {
        (r["rbac"]["namespace"], r["rbac"]["group"], r["rbac"]["resource"], r["rbac"]["verb"])
        for r in sidecars
        if r["rbac"]["allowed"]
    }
    assert used == granted(chart.rbac)
    # list and watch were authorized for the Lease and the candidates Lease by name (the
    # fieldSelector), as the resourceNames rules require.
    assert {r["rbac"]["name"] for r in sidecars if r["rbac"]["verb"] in ("list", "watch")} == {
        chart.lease,
        f"{chart.lease}-candidates",
    }


async def test_the_charts_role_is_enough_for_twelve_shards(helm: Helm, tmp_path: Path) -> None:
    """Past 10 leases the sidecar watches its Leases in one labelled stream, which the Role
    allows by a list/watch rule without names; writes stay limited by name. Every shard gets
    a leader, nothing is refused, and every grant is used."""
    chart = render(helm, "many-shards")
    names = {f"jobs-{i}" for i in range(12)}
    with enforcing(chart, chart.rbac) as fake, three_sidecars(fake, chart, tmp_path) as procs:

        async def every_shard_led() -> bool:
            led = set()
            async with aiohttp.ClientSession() as session:
                for proc in procs:
                    async with session.get(f"http://{proc.local}/leases") as response:
                        body = await response.json()
                    led |= {e["lease"].split("/")[-1] for e in body["leases"] if e["leader"]}
            return led == names

        deadline = time.monotonic() + 20
        while not await every_shard_led():
            assert time.monotonic() < deadline, "not every shard got a leader"
            await asyncio.sleep(0.2)
        requests = await asyncio.to_thread(fake.requests)
    sidecars = [r for r in requests if r["user_agent"].startswith("leader-sidecar/")]
    refused = [r for r in sidecars if r["status"] in (401, 403)]
    assert refused == [], refused[:5]
    used = {
        (r["rbac"]["namespace"], r["rbac"]["group"], r["rbac"]["resource"], r["rbac"]["verb"])
        for r in sidecars
        if r["rbac"]["allowed"]
    }
    # Nothing beyond the Role, and what every run needs was used: the labelled list/watch,
    # creates and renewals (merge patches). A takeover PUT (update) happens only when a lease
    # changes hands, which a quiet start need not do.
    assert used <= granted(chart.rbac)
    verbs = {verb for (_ns, _group, resource, verb) in used if resource == "leases"}
    assert {"get", "list", "watch", "create", "patch"} <= verbs
    # Writes by name only: every update/patch named one of the leases or the candidates.
    written = {r["rbac"]["name"] for r in sidecars if r["rbac"]["verb"] in ("update", "patch")}
    assert written <= names | {"jobs-candidates"}


async def test_without_pods_patch_the_sidecar_still_leads_but_is_refused_and_says_why(
    helm: Helm, tmp_path: Path
) -> None:
    """The negative control: labels are best effort, so the election goes on; the fake
    answers 403 to every label patch, and the sidecar logs the refusal with the fix."""
    chart = render(helm, "example")
    rbac = without(chart.rbac, "", "pods", "patch")
    with enforcing(chart, rbac) as fake, three_sidecars(fake, chart, tmp_path) as procs:
        async with observing(procs) as observer:
            first = await observer.leader(timeout=10)
            leader = by_name(procs, first.name)
            refusal = await asyncio.to_thread(
                leader.wait_log, lambda e: e.get("msg") == REFUSED and e.get("op") == "label pod"
            )
            assert refusal["fix"] == RBAC_FIX
            assert (
                f'pods "{first.name}" is forbidden: User "{chart.user}" cannot patch resource '
                f'"pods" in API group "" in the namespace "{RELEASE_NAMESPACE}"'
            ) == refusal["error"]
            # Events still go through (their rule is intact), and the leader keeps leading.
            await eventually(
                lambda: any(
                    m.startswith(f"{first.identity} became leader")
                    for m in event_messages(fake, chart)
                )
            )
            await asyncio.sleep(LEASE)
            still = await observer.leader(timeout=2, after=time.time())
            assert (still.identity, still.term) == (first.identity, first.term)
            assert set(role_labels(fake, chart).values()) == {None}
        requests = await asyncio.to_thread(fake.requests)

    refused = [r for r in requests if r["status"] == 403]
    assert refused
    assert {(r["user"], r["method"], r["resource"]) for r in refused} == {
        (chart.user, "PATCH", "pods")
    }
    assert {r["name"] for r in refused} == {first.name}
