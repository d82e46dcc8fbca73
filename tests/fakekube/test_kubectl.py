"""A real kubectl as a second client of the fake: if kubectl can get, apply, watch and delete
Leases through it, the fake speaks discovery, Tables, OpenAPI and watch the way the real API
server does."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakekube import FakeKubeProcess, fake_kube_process
from tests.support.tools import require_binary

pytestmark = pytest.mark.slow

NAMESPACE = "demo"
LEASE_YAML = """\
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: applied-lease
  namespace: demo
spec:
  holderIdentity: {holder}
  leaseDurationSeconds: 15
  renewTime: "2026-11-29T10:05:00.000000Z"
"""


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path, cache: Path) -> None:
        self.binary = binary
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(cache)}
        self.cache = cache

    def command(self, *args: str) -> list[str]:
        return [self.binary, "--cache-dir", str(self.cache / "kube-cache"), *args]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.command(*args), env=self.env, capture_output=True, text=True, timeout=30
        )
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeKubeProcess]:
    with fake_kube_process() as server:
        yield server


@pytest.fixture
def kubectl(fake: FakeKubeProcess, tmp_path: Path) -> Kubectl:
    binary = require_binary("kubectl")
    return Kubectl(binary, fake.kubeconfig(tmp_path / "kubeconfig", NAMESPACE), tmp_path)


def create_lease(fake: FakeKubeProcess, name: str, holder: str) -> None:
    status, body = fake.request(
        "POST",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 3},
        },
    )
    assert status == 201, body


def set_holder(fake: FakeKubeProcess, name: str, holder: str) -> None:
    status, body = fake.request(
        "PATCH",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}",
        {"spec": {"holderIdentity": holder}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body


def test_kubectl_get_lease_shows_the_holder(fake: FakeKubeProcess, kubectl: Kubectl) -> None:
    create_lease(fake, "shown-lease", "app-0_3f9c2a1b")
    out = kubectl.run("get", "lease").stdout.splitlines()
    assert out[0].split() == ["NAME", "HOLDER", "AGE"]
    row = next(line.split() for line in out[1:] if line.startswith("shown-lease"))
    assert row[1] == "app-0_3f9c2a1b"
    assert row[2].endswith("s")
    yaml_out = kubectl.run("get", "lease", "shown-lease", "-o", "yaml").stdout
    assert "holderIdentity: app-0_3f9c2a1b" in yaml_out
    assert "leaseTransitions: 3" in yaml_out


def test_kubectl_apply_creates_updates_and_leaves_unchanged(
    fake: FakeKubeProcess, kubectl: Kubectl, tmp_path: Path
) -> None:
    manifest = tmp_path / "lease.yaml"
    manifest.write_text(LEASE_YAML.format(holder="pod-a"))
    assert kubectl.run("apply", "-f", str(manifest)).stdout.strip() == (
        "lease.coordination.k8s.io/applied-lease created"
    )
    manifest.write_text(LEASE_YAML.format(holder="pod-b"))
    assert kubectl.run("apply", "-f", str(manifest)).stdout.strip() == (
        "lease.coordination.k8s.io/applied-lease configured"
    )
    assert kubectl.run("apply", "-f", str(manifest)).stdout.strip() == (
        "lease.coordination.k8s.io/applied-lease unchanged"
    )
    lease = fake.lease(NAMESPACE, "applied-lease")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "pod-b"
    assert lease["spec"]["renewTime"] == "2026-11-29T10:05:00.000000Z"
    assert "kubectl.kubernetes.io/last-applied-configuration" in lease["metadata"]["annotations"]
    methods = [r["method"] for r in fake.requests() if r["name"] == "applied-lease"]
    assert "POST" not in methods  # creation is a POST to the collection, not the name
    assert methods.count("PATCH") == 1  # "unchanged" sends nothing


def test_kubectl_delete_lease_removes_it(fake: FakeKubeProcess, kubectl: Kubectl) -> None:
    create_lease(fake, "doomed-lease", "pod-a")
    done = kubectl.run("delete", "lease", "doomed-lease")
    assert done.stdout.strip() == 'lease.coordination.k8s.io "doomed-lease" deleted'
    assert fake.lease(NAMESPACE, "doomed-lease") is None
    missing = kubectl.run("get", "lease", "doomed-lease", check=False)
    assert missing.returncode == 1
    assert 'leases.coordination.k8s.io "doomed-lease" not found' in missing.stderr


def test_kubectl_get_lease_watch_prints_the_new_holder(
    fake: FakeKubeProcess, kubectl: Kubectl
) -> None:
    create_lease(fake, "watched-lease", "pod-a")
    proc = subprocess.Popen(
        kubectl.command("get", "lease", "watched-lease", "-w"),
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 15
        while not any("pod-a" in line for line in lines) and time.monotonic() < deadline:
            seen.wait(0.1)
        assert any("pod-a" in line for line in lines), lines
        set_holder(fake, "watched-lease", "pod-z")
        while not any("pod-z" in line for line in lines) and time.monotonic() < deadline:
            seen.wait(0.1)
        assert any(line.split()[:2] == ["watched-lease", "pod-z"] for line in lines), lines
    finally:
        proc.terminate()
        proc.wait(5)
