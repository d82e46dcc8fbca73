"""Demoting the pod: role labels (this pod, and the previous holder's pod) and Events."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.backends.base import Conflict, LeaseHeld
from sidecar.backends.kubernetes import (
    KubernetesLeaseStore,
    demotion_actions,
    gap_alert_listener,
    open_kubernetes_store,
)
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.demotion import (
    MAX_DELAY,
    RETRIES,
    LeaseEvents,
    PodRoleLabel,
    pod_of,
)
from sidecar.config import load
from sidecar.config_error import ConfigError
from sidecar.status import GapAlert, LeaderStatus, Role, Transition
from tests.fakekube import FakeApiServer
from tests.fakekube.wire import EVENTS, LEASES, PODS
from tests.kubernetes.conftest import LEASE, NAMESPACE, StoreFactory
from tests.support.sidecars import REPO

KEY = "leader-sidecar/role"


async def create_pod(fake: FakeApiServer, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1.0"}]},
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{fake.url}/api/v1/namespaces/{NAMESPACE}/pods", json=body) as response,
    ):
        assert response.status == 201


def labels(fake: FakeApiServer, pod: str) -> dict[str, str]:
    found = fake.cluster.get(PODS, NAMESPACE, pod)
    assert found is not None
    return dict(found["metadata"].get("labels", {}))


def status(identity: str, *, leader: bool, term: int = 3) -> LeaderStatus:
    return LeaderStatus(
        leader=leader,
        identity=identity,
        holder=identity if leader else None,
        term=term,
        lease=f"{NAMESPACE}/{LEASE}",
        lease_duration=2.0,
        valid_for=1.0 if leader else 0.0,
        since=datetime(2026, 11, 29, 9, 0, tzinfo=UTC),
    )


def became_leader(identity: str, previous: str | None) -> Transition:
    return Transition(Role.LEADER, "acquired", status(identity, leader=True), previous)


def stopped_leading(identity: str, reason: str) -> Transition:
    return Transition(Role.FOLLOWER, reason, status(identity, leader=False), None)


def pod_patches(fake: FakeApiServer) -> list[str | None]:
    return [r["name"] for r in fake.requests if r["resource"] == "pods" and r["verb"] == "patch"]


@pytest.mark.parametrize(
    ("identity", "pod"),
    [
        ("app-0_3f9c2a1b", "app-0"),
        ("web-7d9f-x2x_ab", "web-7d9f-x2x"),
        ("nosuffix", None),
        (None, None),
    ],
)
def test_the_pod_name_is_the_identity_before_its_last_underscore(
    identity: str | None, pod: str | None
) -> None:
    assert pod_of(identity) == pod


async def test_a_new_leader_relabels_the_previous_holders_pod_first_then_its_own(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    """So a Service selecting role=leader never has two endpoints, even when the previous
    holder was SIGKILLed and could not demote itself."""
    for pod in ("app-0", "app-1"):
        await create_pod(fake, pod)
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        await PodRoleLabel(api, NAMESPACE, "app-0", KEY)(became_leader("app-0_aaaa", None))
        fake.requests.clear()
        await PodRoleLabel(api, NAMESPACE, "app-1", KEY)(became_leader("app-1_bbbb", "app-0_aaaa"))
    finally:
        await api.close()
    assert pod_patches(fake) == ["app-0", "app-1"]
    assert labels(fake, "app-0") == {"app": "demo", KEY: "follower"}
    assert labels(fake, "app-1") == {"app": "demo", KEY: "leader"}


async def test_stopping_labels_this_pod_follower(fake: FakeApiServer, kubeconfig: Path) -> None:
    await create_pod(fake, "app-0")
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        action = PodRoleLabel(api, NAMESPACE, "app-0", KEY)
        await action(became_leader("app-0_aaaa", None))
        await action(stopped_leading("app-0_aaaa", "deadline"))
    finally:
        await api.close()
    assert labels(fake, "app-0")[KEY] == "follower"


async def test_a_previous_holder_whose_pod_is_gone_is_skipped(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    await create_pod(fake, "app-1")
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        await PodRoleLabel(api, NAMESPACE, "app-1", KEY)(became_leader("app-1_b", "app-0_gone"))
    finally:
        await api.close()
    assert labels(fake, "app-1")[KEY] == "leader"


async def test_a_missing_own_pod_says_to_set_pod_name(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        with pytest.raises(RuntimeError, match="set POD_NAME"):
            await PodRoleLabel(api, NAMESPACE, "nope", KEY)(became_leader("nope_1", None))
    finally:
        await api.close()


class Naps:
    """A sleep that does not: it records each wait (the retries' own clock)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def event_posts(fake: FakeApiServer) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r["resource"] == "events" and r["verb"] == "create"]


async def test_a_throttled_label_waits_at_least_retry_after_between_tries(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    """Counted against the retries' own clock: two 429s asking for 3 s, then served."""
    await create_pod(fake, "app-0")
    throttled = {"status": 429, "retry_after": 3, "count": 2, "match": {"resources": ["pods"]}}
    fake.faults = fake.faults.parse({"errors": [throttled]})
    naps = Naps()
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        label = PodRoleLabel(api, NAMESPACE, "app-0", KEY, sleep=naps)
        await label(became_leader("app-0_a", None))
    finally:
        await api.close()
    patches = [r["status"] for r in fake.requests if r["verb"] == "patch"]
    assert patches == [429, 429, 200]
    assert len(naps.waits) == 2
    assert all(3.0 <= wait <= 3.0 + MAX_DELAY for wait in naps.waits)


async def test_a_failing_event_is_retried_ten_times_backing_off_then_given_up(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    fake.faults = fake.faults.parse(
        {"errors": [{"status": 500, "match": {"resources": ["events"]}}]}
    )
    naps = Naps()
    api = KubeApi(str(kubeconfig), 2.0)
    events = LeaseEvents(api, NAMESPACE, LEASE, "app-0_a", "app-0", lambda: None, sleep=naps)
    try:
        with pytest.raises(RuntimeError, match="could not record the Event"):
            await events(became_leader("app-0_a", None))
    finally:
        await api.close()
    assert len(event_posts(fake)) == RETRIES + 1
    steps = [min(MAX_DELAY, 0.1 * 2**n) for n in range(RETRIES)]
    assert len(naps.waits) == len(steps)
    for wait, step in zip(naps.waits, steps, strict=True):
        assert step <= wait <= 2 * step  # doubling, jittered by up to one step, capped


async def test_a_refusal_that_is_not_transient_is_not_retried(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    fake.faults = fake.faults.parse({"forbid": [{"resources": ["events"]}]})
    naps = Naps()
    api = KubeApi(str(kubeconfig), 2.0)
    events = LeaseEvents(api, NAMESPACE, LEASE, "app-0_a", "app-0", lambda: None, sleep=naps)
    try:
        with pytest.raises(RuntimeError):
            await events(became_leader("app-0_a", None))
    finally:
        await api.close()
    assert len(event_posts(fake)) == 1
    assert naps.waits == []


async def test_a_label_or_event_is_tried_once_while_the_store_refuses(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    """While the sidecar's store probe says the API server refuses, a label or Event that
    fails is not retried: the one probe asks for everyone (a sidecar whose 16 leases step down
    in an outage would otherwise retry 32 Events for minutes). Retried when it is not."""
    await create_pod(fake, "app-0")
    fake.faults = fake.faults.parse({"errors": [{"status": 503}]})
    naps = Naps()
    api = KubeApi(str(kubeconfig), 2.0)
    refusing = [True]
    events = LeaseEvents(
        api, NAMESPACE, LEASE, "app-0_a", "app-0", lambda: None, sleep=naps,
        refusing=lambda: refusing[0],
    )  # fmt: skip
    label = PodRoleLabel(api, NAMESPACE, "app-0", KEY, sleep=naps, refusing=lambda: refusing[0])
    try:
        with pytest.raises(RuntimeError):
            await events(stopped_leading("app-0_a", "deadline"))
        with pytest.raises(RuntimeError):
            await label(stopped_leading("app-0_a", "deadline"))
        assert (len(event_posts(fake)), len(pod_patches(fake)), naps.waits) == (1, 1, [])
        refusing[0] = False
        with pytest.raises(RuntimeError):
            await events(stopped_leading("app-0_a", "deadline"))
    finally:
        await api.close()
    assert len(event_posts(fake)) == 1 + RETRIES + 1


async def test_transient_failures_are_retried_a_few_times(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    await create_pod(fake, "app-0")
    fake.faults = fake.faults.parse(
        {"errors": [{"status": 503, "count": 2, "match": {"resources": ["pods"]}}]}
    )
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        await PodRoleLabel(api, NAMESPACE, "app-0", KEY)(became_leader("app-0_a", None))
    finally:
        await api.close()
    assert labels(fake, "app-0")[KEY] == "leader"
    assert len(pod_patches(fake)) == 3


async def test_every_transition_is_an_event_about_the_lease(
    fake: FakeApiServer, kubeconfig: Path, make_store: StoreFactory
) -> None:
    store = make_store()
    await store.try_acquire("app-0_aaaa", 2, 0, expected=None)
    api = KubeApi(str(kubeconfig), 2.0)
    events = LeaseEvents(api, NAMESPACE, LEASE, "app-0_aaaa", "app-0", lambda: store.uid)
    try:
        await events(became_leader("app-0_aaaa", "app-9_old"))
        await events(stopped_leading("app-0_aaaa", "lost"))
        await events(stopped_leading("app-0_aaaa", "shutdown"))
        await events.gap(
            GapAlert(
                1.2, 2.0, True, "renew timed out after 0.333s", status("app-0_aaaa", leader=True)
            )
        )
        await events.app_alone(LEASE, "answered 503")
    finally:
        await api.close()
    recorded = fake.cluster.list(EVENTS, NAMESPACE)
    recorded.sort(key=lambda event: event["metadata"]["name"])
    summary = [(e["type"], e["reason"], e["message"]) for e in recorded]
    assert summary == [
        (
            "Normal",
            "LeaderElection",
            "app-0_aaaa became leader (term 3; previous holder: app-9_old)",
        ),
        (
            "Warning",
            "LeaderElection",
            "app-0_aaaa stopped leading (term 3): another replica holds the lease now, or it was "
            "deleted",
        ),
        ("Normal", "LeaderElection", "app-0_aaaa stopped leading (term 3): released on shutdown"),
        (
            "Warning",
            "LeaseRenewalGap",
            "app-0_aaaa: 1.20s without a confirmed renewal on a 2s lease (still growing); last "
            "error: renew timed out after 0.333s",
        ),
        (
            "Warning",
            "AppDownNoSuccessor",
            "app-0_aaaa keeps leading with its app down: no other replica's app is up to hand "
            "the lease to; the app: answered 503",
        ),
    ]
    for event in recorded:
        assert event["involvedObject"] == {
            "kind": "Lease",
            "namespace": NAMESPACE,
            "name": LEASE,
            "uid": store.uid,
            "apiVersion": "coordination.k8s.io/v1",
        }
        assert event["related"]["name"] == "app-0"
        assert event["reportingComponent"] == "leader-sidecar"
        assert event["source"] == {"component": "leader-sidecar"}
        assert event["count"] == 1
        assert event["firstTimestamp"] == event["lastTimestamp"]
        assert event["firstTimestamp"].endswith("Z")
        assert event["metadata"]["name"].startswith(f"{LEASE}.")


def kube_config(kubeconfig: Path, *extra: str) -> object:
    return load(
        [
            "--store",
            "kubernetes",
            "--lease",
            LEASE,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            str(kubeconfig),
            *extra,
        ],
        environ={},
    )


async def test_without_a_pod_name_only_events_are_recorded(
    kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = kube_config(kubeconfig)
    store = open_kubernetes_store(config)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.INFO, logger="sidecar.kubernetes"):
            actions = demotion_actions(config, store)  # type: ignore[arg-type]
        assert [action.name for action in actions] == ["kubernetes-event"]
        assert any("not labelling pods" in r.getMessage() for r in caplog.records)
        with_pod = demotion_actions(kube_config(kubeconfig, "--pod-name", "app-0"), store)  # type: ignore[arg-type]
        assert [action.name for action in with_pod] == ["pod-role-label", "kubernetes-event"]
        no_key = kube_config(kubeconfig, "--pod-name", "app-0", "--role-label-key", "")
        assert [a.name for a in demotion_actions(no_key, store)] == ["kubernetes-event"]  # type: ignore[arg-type]
    finally:
        await store.close()


async def test_the_actions_share_the_stores_client_and_know_the_lease_uid(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    config = kube_config(kubeconfig)
    store = open_kubernetes_store(config)  # type: ignore[arg-type]
    try:
        assert isinstance(store, KubernetesLeaseStore)
        await store.try_acquire("app-0_a", 2, 0, expected=None)
        listener = gap_alert_listener(config, store)  # type: ignore[arg-type]
        await listener(GapAlert(1.5, 2.0, False, None, status("app-0_a", leader=True)))
    finally:
        await store.close()
    (event,) = fake.cluster.list(EVENTS, NAMESPACE)
    assert event["involvedObject"]["uid"] == store.uid
    assert event["message"].endswith("(then renewed)")


def test_outside_a_cluster_without_a_kubeconfig_the_store_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = load(["--store", "kubernetes", "--lease", LEASE], environ={})
    with pytest.raises(ConfigError, match="give --kubeconfig or KUBECONFIG"):
        open_kubernetes_store(config)


def test_the_cli_exits_2_with_one_line_when_there_is_no_cluster() -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "--store",
            "kubernetes",
            "--lease",
            LEASE,
            "--listen",
            "127.0.0.1:0",
            "--public-listen",
            "127.0.0.1:0",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("leader-sidecar: --store=kubernetes: not running in a Kubernetes")


async def test_pods_may_live_in_another_namespace_than_the_lease(
    fake: FakeApiServer, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--namespace`` names the Lease's namespace; the pods are in ``POD_NAMESPACE``."""
    fake.cluster.namespaces.add("apps")
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app-0"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1.0"}]},
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{fake.url}/api/v1/namespaces/apps/pods", json=body) as response,
    ):
        assert response.status == 201
    monkeypatch.setenv("POD_NAMESPACE", "apps")
    config = kube_config(kubeconfig, "--pod-name", "app-0")
    store = open_kubernetes_store(config)  # type: ignore[arg-type]
    try:
        for action in demotion_actions(config, store):  # type: ignore[arg-type]
            await action(became_leader("app-0_a", None))
    finally:
        await store.close()
    pod = fake.cluster.get(PODS, "apps", "app-0")
    assert pod is not None
    assert pod["metadata"]["labels"] == {KEY: "leader"}
    (event,) = fake.cluster.list(EVENTS, NAMESPACE)
    assert event["involvedObject"]["namespace"] == NAMESPACE
    assert (event["related"]["namespace"], event["related"]["name"]) == ("apps", "app-0")


async def test_a_new_leader_relabels_a_holder_that_released_but_kept_its_leader_label(
    fake: FakeApiServer, kubeconfig: Path, make_store: StoreFactory
) -> None:
    """The old leader released on shutdown but its own 'follower' label never reached the API
    (say, the API was slow): the new leader still relabels it, from what its store saw."""
    for pod in ("app-0", "app-1"):
        await create_pod(fake, pod)
    old, new = make_store(), make_store()
    api = KubeApi(str(kubeconfig), 2.0)
    try:
        granted = await old.try_acquire("app-0_aaaa", 2, 0, expected=None)
        await PodRoleLabel(api, NAMESPACE, "app-0", KEY)(became_leader("app-0_aaaa", None))
        with pytest.raises((LeaseHeld, Conflict)):  # the new one has seen app-0 lead
            await new.try_acquire("app-1_bbbb", 2, 0, expected=None)
        released = await old.release("app-0_aaaa", granted.term)  # ... never relabelled
        assert released is not None
        await new.try_acquire("app-1_bbbb", 2, 0, expected=released.version)
        assert new.previous_holder == "app-0_aaaa"
        action = PodRoleLabel(api, NAMESPACE, "app-1", KEY, lambda: new.previous_holder)
        # The elector saw the lease free, so its transition names no previous holder.
        await action(became_leader("app-1_bbbb", None))
    finally:
        await api.close()
    assert labels(fake, "app-0")[KEY] == "follower"
    assert labels(fake, "app-1")[KEY] == "leader"


async def test_with_several_leases_each_event_names_its_own_lease(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    """``--lease a,b`` (and ``--shards``): the sidecar leads both, and the Events of each
    transition are about the Lease that changed hands — its name and uid — not all about the
    first lease."""
    from sidecar.app import Sidecar

    config = load(
        [
            "--store", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
            "--lease", "first,second", "--lease-duration", "2s",
            "--listen", "127.0.0.1:0", "--public-listen", "127.0.0.1:0",
        ],
        environ={},
    )  # fmt: skip
    sidecar = Sidecar(config)
    await sidecar.start()
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while len(fake.cluster.list(EVENTS, NAMESPACE)) < 2:
            assert asyncio.get_running_loop().time() < deadline, "no Event for both leases"
            await asyncio.sleep(0.05)
    finally:
        await sidecar.stop()
    leases = {lease["metadata"]["name"]: lease for lease in fake.cluster.list(LEASES, NAMESPACE)}
    about: dict[str, list[str]] = {}
    for event in fake.cluster.list(EVENTS, NAMESPACE):
        involved = event["involvedObject"]
        assert involved["uid"] == leases[involved["name"]]["metadata"]["uid"]
        assert event["metadata"]["name"].startswith(f"{involved['name']}.")
        about.setdefault(involved["name"], []).append(event["message"])
    assert sorted(about) == ["first", "second"]
    for messages in about.values():
        assert any("became leader" in message for message in messages), messages
