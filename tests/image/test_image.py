"""The container image, built for real from the Dockerfile and run as a user would run it: the
CLI answers, it runs as the numeric non-root user with a read-only root filesystem, a replica on
the embedded store becomes leader and says so over the published port and over localhost, and
SIGTERM releases and exits 0 at once. Two replicas sharing a volume elect exactly one leader.
Configured exactly as the Helm chart configures the container, it leads on the Kubernetes store
(the project's fake API server) and labels its pod leader, then follower on SIGTERM. The
image has no shell: what runs inside it is the image's own python3. Every sidecar module and
store driver imports there, no .pyc is stale, and it stays under a size ceiling.

Slow (a debootstrapped base the first time, ~40 s; the build 70-100 s, it downloads the
dependencies from PyPI; it starts in the background at collection, see background.py): marked
``image``. It runs in CI (``CI=true``); elsewhere it is opt-in:
``python -m pytest -m image tests/image`` or LEADER_SIDECAR_IMAGE_TESTS=1.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import Helm, one, sidecar
from tests.image.background import TOOLS, BackgroundBuild, wanted
from tests.image.containers import inspect_image, podman, podman_run
from tests.support.tools import REPO, require_binary

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(1200)]

UID = "65532"


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest, image_build: BackgroundBuild) -> str:
    """The image built from the Dockerfile: started in the background at collection (see
    tests/image/background.py), waited for here."""
    if not wanted(request.config):
        pytest.skip(
            "builds the image (~1-2 min): opt-in outside CI with "
            "`python -m pytest -m image tests/image` or LEADER_SIDECAR_IMAGE_TESTS=1"
        )
    for tool in TOOLS:
        require_binary(tool)
    return image_build.tag()


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"leader-sidecar-test-{uuid.uuid4().hex[:10]}"
    yield name
    podman("rm", "--force", "--volumes", "--time", "1", name, check=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def wait_for(url: str, status: int, deadline: float = 30.0) -> dict[str, Any]:
    """Poll until `url` answers `status`; its JSON body."""
    end = time.monotonic() + deadline
    last: object = None
    while time.monotonic() < end:
        try:
            code, body = get_json(url)
            if code == status:
                return body
            last = (code, body)
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer {status} within {deadline}s; last: {last!r}")


def stopped_log(name: str) -> dict[str, Any]:
    """The sidecar's last JSON log line, which says whether it released the lease."""
    logs = podman("logs", name)
    lines = [json.loads(line) for line in (logs.stdout + logs.stderr).splitlines() if line]
    assert lines, "no log"
    assert lines[-1]["msg"] == "stopped", lines[-3:]
    return lines[-1]


def read_only_run(image: str, name: str, *args: str, volume: str | None = None) -> list[str]:
    """``podman run`` arguments for a detached replica: read-only root with no tmpfs added
    anywhere (stricter than ``docker run --read-only``), only the state volume writable."""
    flags = ["--detach", "--name", name, "--read-only", "--read-only-tmpfs=false"]
    if volume:
        flags += ["--volume", f"{volume}:/var/lib/leader-sidecar"]
    return [*flags, *args, image]


def test_help_answers(image: str) -> None:
    result = podman_run("--rm", "--read-only", image, "--help")
    assert result.stdout.startswith("usage: leader-sidecar")
    assert "LEADER_SIDECAR_" in result.stdout
    assert "--store URL" in result.stdout


def test_it_runs_as_the_numeric_non_root_user(image: str) -> None:
    config = inspect_image(image)["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["leader-sidecar"]
    result = in_image(
        image,
        "import grp, os, pwd; "
        "print(f'uid={os.getuid()}({pwd.getpwuid(os.getuid()).pw_name}) "
        "gid={os.getgid()}({grp.getgrgid(os.getgid()).gr_name})')",
    )
    assert result.split() == [f"uid={UID}(leader-sidecar)", f"gid={UID}(leader-sidecar)"]


def in_image(image: str, code: str) -> str:
    """What a Python snippet prints, run by the image's interpreter (there is no shell)."""
    result = podman_run("--rm", "--read-only", "--entrypoint", "python3", image, "-c", code)
    return result.stdout


ABSENT_TOOLS = (
    "sh",
    "bash",
    "dash",
    "gcc",
    "cc",
    "c++",
    "make",
    "pip",
    "pip3",
    "apt-get",
    "dpkg",
    "perl",
)


def test_the_final_image_has_no_shell_compiler_package_manager_or_pip(image: str) -> None:
    """Only the interpreter and what it loads: nothing to install, build or script with."""
    result = in_image(
        image,
        "import json, os, shutil; "
        f"print(json.dumps([[shutil.which(t) for t in {list(ABSENT_TOOLS)!r}], "
        "os.listdir('/opt/leader-sidecar/bin')]))",
    )
    found, listing = json.loads(result)
    assert "leader-sidecar" in listing  # the listing ran
    assert [path for path in found if path] == [], "found in the image"
    assert not any(name.startswith("pip") for name in listing)


# Every module of the sidecar, which imports each store's driver (redis-py for Redis and
# Sentinel, asyncpg for PostgreSQL, aiohttp for Kubernetes and etcd, sqlite3), PyYAML for
# kubeconfig files, and TLS with the image's CA bundle; JSON out.
DRIVERS_PROBE = """
import importlib, json, pkgutil, sqlite3, ssl
import sidecar
failed = {}
walked = pkgutil.walk_packages(sidecar.__path__, "sidecar.")
modules = [info.name for info in walked if not info.name.endswith("__main__")]  # runs the CLI
for name in modules + ["asyncpg", "redis.asyncio.sentinel", "yaml", "aiohttp.web"]:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = repr(error)
print(json.dumps({
    "modules": len(modules),
    "failed": failed,
    "sqlite": sqlite3.connect(":memory:").execute("select sqlite_version()").fetchone()[0],
    "ca_certificates": ssl.create_default_context().cert_store_stats()["x509_ca"],
}))
"""


def test_every_store_driver_imports_in_the_image(image: str) -> None:
    """The standard library was trimmed and the shared libraries picked by ldd: every
    sidecar module and every driver the chart can select still loads, and TLS to a store
    has CA certificates to verify against."""
    probe = json.loads(in_image(image, DRIVERS_PROBE))
    assert probe["failed"] == {}
    assert probe["modules"] > 50
    assert probe["sqlite"].startswith("3.")
    assert probe["ca_certificates"] > 100


# The .pyc header (PEP 552): flags, then the source's mtime and size unless hash-based.
BYTECODE_PROBE = """
import importlib.util, json, os, struct, sys
counts = {"hash": 0, "timestamp": 0, "stale": 0, "missing": 0}
for top in [p for p in sys.path if os.path.isdir(p)]:
    for directory, _dirs, files in os.walk(top):
        for name in (f for f in files if f.endswith(".py")):
            source = os.path.join(directory, name)
            try:
                with open(importlib.util.cache_from_source(source), "rb") as pyc:
                    flags, mtime, size = struct.unpack("<III", pyc.read(16)[4:])
            except FileNotFoundError:
                counts["missing"] += 1
                continue
            info = os.stat(source)
            fresh = (mtime, size) == (int(info.st_mtime) & 0xFFFFFFFF, info.st_size)
            counts["hash" if flags else "timestamp" if fresh else "stale"] += 1
print(json.dumps(counts))
"""


def test_bytecode_is_never_recompiled_on_the_read_only_root(image: str) -> None:
    """Every module has bytecode that Python accepts as is: a missing or stale .pyc would
    be compiled again, in memory, at every start."""
    counts = json.loads(in_image(image, BYTECODE_PROBE))
    assert counts["stale"] == 0, counts
    assert counts["missing"] == 0, counts
    assert counts["hash"] + counts["timestamp"] > 500, counts


def test_the_image_stays_small(image: str) -> None:
    """A ceiling, not a benchmark (docs/benchmarks.md has the measured size, 80-odd MB):
    what fails here is a base image, a dependency or a staging change that brings back
    tens of MB."""
    size_mb = inspect_image(image)["Size"] / 1e6
    assert size_mb <= 120, f"{size_mb:.0f} MB"


def test_oci_labels(image: str) -> None:
    labels = inspect_image(image)["Config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "leader-sidecar"
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")


def test_one_replica_leads_on_the_embedded_store_with_a_read_only_root(
    image: str, container_name: str
) -> None:
    port = free_port()
    podman_run(
        *read_only_run(image, container_name, "--publish", f"127.0.0.1:{port}:4041"),
        "--lease-duration",
        "3s",
        "--log-format",
        "json",
    )
    # The public listener, through the published port.
    body = wait_for(f"http://127.0.0.1:{port}/leader", 200)
    assert body["leader"] is True
    assert body["term"] >= 1
    assert body["lease"] == "default"
    assert body["holder"] == body["identity"]
    assert wait_for(f"http://127.0.0.1:{port}/readyz", 200) == {"ok": True}
    # The localhost API, from inside the container (it is not published).
    local = podman(
        "exec",
        container_name,
        "python3",
        "-c",
        "import urllib.request; r = urllib.request.urlopen('http://127.0.0.1:4040/leader', "
        "timeout=2); print(r.status, r.read().decode())",
    ).stdout
    status, _, payload = local.partition(" ")
    assert status == "200"
    assert json.loads(payload)["identity"] == body["identity"]
    # The root is read-only; only the state volume (the image's VOLUME) takes writes.
    denied = podman(
        "exec", container_name, "python3", "-c", "open('/opt/leader-sidecar/x', 'w')", check=False
    )
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stderr
    files = podman(
        "exec", container_name, "python3", "-c", "import os; print(*os.listdir())"
    ).stdout.split()
    assert "leader-sidecar.db" in files

    started = time.monotonic()
    podman("stop", "--time", "10", container_name, timeout=30)
    stop_took = time.monotonic() - started
    state = json.loads(podman("inspect", container_name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, state  # exited on its own, not killed after the 10 s
    assert stop_took < 5, f"stop took {stop_took:.1f}s; the sidecar promises 2s"
    assert stopped_log(container_name)["released"] is True


def test_two_replicas_sharing_the_state_volume_elect_one_leader(image: str) -> None:
    """The embedded store across containers on one host: one file in a shared volume."""
    volume = f"leader-sidecar-test-{uuid.uuid4().hex[:10]}"
    names = [f"{volume}-a", f"{volume}-b"]
    ports = [free_port(), free_port()]
    podman("volume", "create", volume)
    try:
        for name, port in zip(names, ports, strict=True):
            podman_run(
                *read_only_run(image, name, "--publish", f"127.0.0.1:{port}:4041", volume=volume),
                "--lease-duration",
                "3s",
            )
        for port in ports:
            wait_for(f"http://127.0.0.1:{port}/readyz", 200)
        answers = [get_json(f"http://127.0.0.1:{port}/leader") for port in ports]
        leaders = [i for i, (status, _) in enumerate(answers) if status == 200]
        assert len(leaders) == 1, answers
        leader, follower = leaders[0], 1 - leaders[0]
        term = answers[leader][1]["term"]
        assert answers[follower][1]["holder"] == answers[leader][1]["identity"]

        # The leader stops (SIGTERM releases): the follower takes over with a higher term,
        # well before the 3 s lease would have expired.
        podman("stop", "--time", "10", names[leader], timeout=30)
        released_at = time.monotonic()
        body = wait_for(f"http://127.0.0.1:{ports[follower]}/leader", 200, deadline=10)
        assert body["term"] > term
        assert time.monotonic() - released_at < 3
        assert stopped_log(names[leader])["released"] is True
    finally:
        for name in names:
            podman("rm", "--force", "--volumes", "--time", "1", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


@pytest.fixture
def fake_kubernetes() -> Iterator[str]:
    """The project's fake API server (tests/fakekube) in its own process; its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakekube"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        url: str = json.loads(proc.stdout.readline())["url"]
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def kube(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def test_configured_by_the_chart_it_leads_on_kubernetes_and_labels_its_pod(
    image: str, container_name: str, fake_kubernetes: str, tmp_path: Path
) -> None:
    """The chart's container spec — environment, user, read-only root, dropped capabilities,
    the kubeconfig Secret and the /tmp it mounts — run in the image against the fake API
    server: the pod is labelled leader (what the leader Service selects), the Lease names it,
    and on SIGTERM the pod turns follower and the Lease is released."""
    api_port, public_port = free_port(), free_port()
    values = {
        "example": {"enabled": True},
        "kubeconfig": {"existingSecret": "remote-cluster"},
        "lease": {"duration": "3s"},
        "api": {"host": "127.0.0.1", "port": api_port},
        "public": {"host": "127.0.0.1", "port": public_port},  # host network: keep it local
    }
    manifests = Helm.create(tmp_path).template(values=values, namespace="default")
    deployment = one(manifests, "Deployment")
    container = sidecar(deployment)
    pod_name = "demo-leader-sidecar-example-5d8f9-abcde"
    kube(
        fake_kubernetes,
        "POST",
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": deployment["spec"]["template"]["metadata"]["labels"],
            },
            "spec": {"containers": [{"name": "app", "image": "app"}]},
        },
    )
    kubeconfig_dir = tmp_path / "kubeconfig"
    kubeconfig_dir.mkdir(mode=0o755)
    (kubeconfig_dir / "kubeconfig").write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": fake_kubernetes}}],
                "users": [{"name": "sidecar", "user": {"token": "unused"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sidecar"}}],
                "current-context": "fake",
            }
        )
    )
    (kubeconfig_dir / "kubeconfig").chmod(0o644)

    # The container spec as podman flags: the Downward API fields filled in as the kubelet would.
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": "default",
        "metadata.labels['pod-template-hash']": "7d9c",  # the chart's --revision
        "status.podIP": "127.0.0.1",  # the pod's own address (an app health URL may name it)
    }
    flags: list[str] = []
    for var in container["env"]:
        value = (
            var["value"] if "value" in var else fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        )
        flags += ["--env", f"{var['name']}={value}"]
    security = container["securityContext"]
    flags += [
        "--user",
        f"{security['runAsUser']}:{security['runAsGroup']}",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    flags += ["--volume", f"{kubeconfig_dir}:{mounts['leader-sidecar-kubeconfig']}:ro"]
    flags += ["--tmpfs", f"{mounts['leader-sidecar-tmp']}:size=1m"]
    assert security["readOnlyRootFilesystem"] is True
    podman_run(
        "--detach",
        "--name",
        container_name,
        "--network",
        "host",
        "--read-only",
        "--read-only-tmpfs=false",
        *flags,
        image,
    )

    body = wait_for(f"http://127.0.0.1:{public_port}/leader", 200)
    assert body["lease"] == "default/demo-leader-sidecar"
    assert body["identity"].startswith(pod_name + "_")
    lease = kube(
        fake_kubernetes,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/demo-leader-sidecar",
    )
    assert lease["spec"]["holderIdentity"] == body["identity"]

    def role() -> str | None:
        pod = kube(fake_kubernetes, "GET", f"/api/v1/namespaces/default/pods/{pod_name}")
        labels: dict[str, str] = pod["metadata"]["labels"]
        return labels.get("leader-sidecar/role")

    end = time.monotonic() + 10
    while role() != "leader" and time.monotonic() < end:
        time.sleep(0.2)
    assert role() == "leader"

    podman("stop", "--time", "10", container_name, timeout=30)
    state = json.loads(podman("inspect", container_name).stdout)[0]["State"]
    assert state["ExitCode"] == 0
    assert role() == "follower"
    lease = kube(
        fake_kubernetes,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/demo-leader-sidecar",
    )
    assert not lease["spec"].get("holderIdentity")
