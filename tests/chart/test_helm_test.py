"""`helm test`: the chart's test pod, rendered, and its check run against real sidecars.

The script is taken from the rendered Pod (not from the file), so what runs here is exactly
what the pod runs: three real sidecars on one SQLite file pass it; a second replica claiming
leadership, or a leader Service that reaches a follower or an impostor, fail it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web

from tests.chart.helm import CHART, Helm, Manifest, find, one
from tests.chart.switches import EXAMPLE, SWITCHES
from tests.support.sidecars import SidecarProcess, sidecars

HOOK = "helm.sh/hook"


def hooks(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if (m["metadata"].get("annotations") or {}).get(HOOK)]


def check_pod(manifests: list[Manifest]) -> Manifest:
    return one(manifests, "Pod", "demo-leader-sidecar-test")


def check_args(pod: Manifest) -> tuple[str, list[str]]:
    """The pod's check: (script, its arguments)."""
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python3", "-c"]
    script, *args = container["args"]
    return script, args


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# -- rendered ---------------------------------------------------------------------------------


def test_the_test_pod_and_its_replica_service_are_test_hooks_and_nothing_else_is(
    helm: Helm,
) -> None:
    """`helm install` creates neither; `helm test` creates the Service first, then the pod."""
    manifests = helm.template(values=EXAMPLE)
    found = {(m["kind"], m["metadata"]["name"]) for m in hooks(manifests)}
    assert found == {
        ("Service", "demo-leader-sidecar-test-replicas"),
        ("Pod", "demo-leader-sidecar-test"),
    }
    service = one(manifests, "Service", "demo-leader-sidecar-test-replicas")
    annotations = service["metadata"]["annotations"]
    assert annotations[HOOK] == "test"
    assert int(annotations["helm.sh/hook-weight"]) < int(
        check_pod(manifests)["metadata"]["annotations"].get("helm.sh/hook-weight", "0")
    )
    assert check_pod(manifests)["spec"]["restartPolicy"] == "Never"


def test_the_pod_runs_the_charts_script_against_every_replica_and_the_leader_service(
    helm: Helm,
) -> None:
    manifests = helm.template(values=EXAMPLE)
    script, args = check_args(check_pod(manifests))
    assert script.strip() == (CHART / "files" / "helm-test.py").read_text().strip()
    assert flag(args, "--replicas-dns") == "demo-leader-sidecar-test-replicas.apps.svc:4041"
    assert flag(args, "--service") == "demo-leader-sidecar-leader.apps.svc:4041"
    assert flag(args, "--expect-replicas") == "3"  # the example's replicas


def test_the_replica_service_finds_every_pod_of_the_lease_ready_or_not(helm: Helm) -> None:
    """Same pods as the leader Service minus the role: a not-ready pod may still lead."""
    manifests = helm.template(values=EXAMPLE)
    replicas = one(manifests, "Service", "demo-leader-sidecar-test-replicas")["spec"]
    leader = one(manifests, "Service", "demo-leader-sidecar-leader")["spec"]
    assert replicas["clusterIP"] == "None"
    assert replicas["publishNotReadyAddresses"] is True
    assert {**replicas["selector"], "leader-sidecar/role": "leader"} == leader["selector"]
    assert [p["targetPort"] for p in replicas["ports"]] == ["sidecar-public"]


def test_the_leader_service_reaches_the_leaders_sidecar(helm: Helm) -> None:
    """What the test asks through the Service: the leader's public /leader."""
    ports = one(helm.template(), "Service", "demo-leader-sidecar-leader")["spec"]["ports"]
    assert {"name": "sidecar-public", "port": 4041, "targetPort": "sidecar-public"}.items() <= (
        ports[-1].items()
    )


def test_without_a_leader_service_the_test_checks_only_the_replicas(helm: Helm) -> None:
    """Redis and SQLite do not label pods: no leader Service to ask."""
    _, args = check_args(check_pod(helm.template(values=SWITCHES["redis"])))
    assert "--service" not in args
    assert flag(args, "--replicas-dns") is not None


def test_replicas_and_timeout_are_values(helm: Helm) -> None:
    manifests = helm.template(values={"helmTest": {"replicas": 5, "timeout": 30}})
    _, args = check_args(check_pod(manifests))
    assert flag(args, "--expect-replicas") == "5"
    assert flag(args, "--timeout") == "30"
    _, args = check_args(check_pod(helm.template()))
    assert "--expect-replicas" not in args  # without the example the chart cannot know


def test_the_test_can_be_switched_off(helm: Helm) -> None:
    manifests = helm.template(values={**EXAMPLE, "helmTest": {"enabled": False}})
    assert hooks(manifests) == []
    assert find(manifests, "Pod") == []


# -- the same script against real sidecars -----------------------------------------------------


@pytest.fixture(scope="module")
def script(helm: Helm) -> str:
    return check_args(check_pod(helm.template(values=EXAMPLE)))[0]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SidecarProcess]]:
    """Three real sidecars on one SQLite file."""
    store = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'leases.db'}"
    with sidecars(["a", "b", "c"], store, lease_duration="2s") as procs:
        yield procs


async def run_check(script: str, *args: str, timeout: float = 0) -> tuple[int, str]:
    """Run the pod's script; `timeout` 0 means one round, no retries."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        "--timeout",
        str(timeout),
        "--interval",
        "0.2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout + 30)
    assert proc.returncode is not None
    return proc.returncode, output.decode()


def replica_args(procs: list[SidecarProcess]) -> list[str]:
    return [arg for proc in procs for arg in ("--replica", proc.public)]


async def leader_and_followers(
    script: str, procs: list[SidecarProcess]
) -> tuple[SidecarProcess, list[SidecarProcess]]:
    """Wait (with the script itself) until the three agree, then say who leads."""
    code, output = await run_check(script, *replica_args(procs), timeout=20)
    assert code == 0, output
    identity = output.split("PASS: ", 1)[1].split(" ", 1)[0]
    (leader,) = [p for p in procs if p.identity == identity]
    return leader, [p for p in procs if p is not leader]


@pytest.fixture
async def impostor() -> AsyncIterator[str]:
    """A fake replica that answers 200 and claims to lead: HOST:PORT."""

    async def claim(_: web.Request) -> web.Response:
        body: dict[str, Any] = {"leader": True, "identity": "impostor_0", "holder": "impostor_0"}
        return web.json_response({**body, "term": 999})

    app = web.Application()
    app.router.add_get("/leader", claim)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.slow
async def test_it_passes_with_one_leader_that_the_service_reaches(
    script: str, replicas: list[SidecarProcess]
) -> None:
    leader, _ = await leader_and_followers(script, replicas)
    code, output = await run_check(
        script, *replica_args(replicas), "--service", leader.public, "--expect-replicas", "3"
    )
    assert code == 0, output
    assert f"PASS: {leader.identity} leads" in output
    assert "the leader Service reaches it" in output


@pytest.mark.slow
async def test_it_finds_the_replicas_by_name(script: str, replicas: list[SidecarProcess]) -> None:
    """--replicas-dns resolves a name to the replicas' addresses (here one, by IP)."""
    leader, _ = await leader_and_followers(script, replicas)
    code, output = await run_check(
        script, "--replicas-dns", leader.public, "--expect-replicas", "1"
    )
    assert code == 0, output
    assert f"PASS: {leader.identity} leads (term" in output


@pytest.mark.slow
async def test_it_fails_when_the_service_reaches_a_follower(
    script: str, replicas: list[SidecarProcess]
) -> None:
    _, followers = await leader_and_followers(script, replicas)
    code, output = await run_check(
        script, *replica_args(replicas), "--service", followers[0].public
    )
    assert code == 1
    assert "FAIL" in output
    assert f"the leader Service reached a non-leader: 503 from {followers[0].identity}" in output


@pytest.mark.slow
async def test_it_fails_when_a_second_replica_claims_to_lead(
    script: str, replicas: list[SidecarProcess], impostor: str
) -> None:
    leader, _ = await leader_and_followers(script, replicas)
    code, output = await run_check(
        script, *replica_args(replicas), "--replica", impostor, "--service", leader.public
    )
    assert code == 1
    assert "2 replicas claim to lead" in output
    assert "impostor_0" in output


@pytest.mark.slow
async def test_it_fails_when_the_service_reaches_a_pod_that_is_not_the_replicas_leader(
    script: str, replicas: list[SidecarProcess], impostor: str
) -> None:
    leader, _ = await leader_and_followers(script, replicas)
    code, output = await run_check(script, *replica_args(replicas), "--service", impostor)
    assert code == 1
    assert (
        f"the leader Service reached 'impostor_0', which claims to lead; "
        f"the replicas say {leader.identity!r} leads"
    ) in output


@pytest.mark.slow
async def test_it_fails_when_a_replica_is_missing_or_silent(
    script: str, replicas: list[SidecarProcess]
) -> None:
    code, output = await run_check(script, *replica_args(replicas), "--expect-replicas", "4")
    assert code == 1
    assert "expected 4 replicas, found 3" in output
    code, output = await run_check(script, *replica_args(replicas), "--replica", "127.0.0.1:1")
    assert code == 1
    assert "http://127.0.0.1:1/leader: no /leader answer" in output
