"""The fake API server in its own process (for real sidecar processes and kubectl), and a small
synchronous client for its API and control ports."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fakekube.server import write_kubeconfig

REPO = Path(__file__).resolve().parents[2]


class FakeKubeClient:
    """Plain HTTP against a running fake: the API (as an admin would use it) and the control
    port (faults, partitions, the request log). Synchronous: do not use it against an
    in-process fake from the same event loop."""

    def __init__(self, url: str, control_url: str, token: str = "fake-token") -> None:
        self.url = url
        self.control_url = control_url
        self.token = token

    # -- raw HTTP ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
        base: str | None = None,
        timeout: float = 5.0,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            (base or self.url) + path,
            data=data,
            method=method,
            headers={
                "Accept": accept,
                "Authorization": f"Bearer {self.token}",
                "User-Agent": "fakekube-test-client/1.0",
            },
        )
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            raw = error.read()
            status = error.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def control(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body, base=self.control_url)
        if status >= 300:
            raise RuntimeError(f"control {method} {path}: {status} {answer}")
        return answer

    # -- control ------------------------------------------------------------------------------

    def set_faults(self, **faults: Any) -> Any:
        return self.control("PUT", "/_fake/faults", faults)

    def clear_faults(self) -> Any:
        return self.control("DELETE", "/_fake/faults")

    def set_rbac(
        self, objects: list[dict[str, Any]], users: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        """Enforce RBAC (see ``authz``): ``objects`` are Roles and RoleBindings, ``users`` maps
        bearer tokens to ``{"name": ..., "groups": [...]}``. This client's own token becomes
        an admin (``system:masters``) unless ``users`` names it, so the test can still set up
        and inspect the cluster."""
        table = {self.token: {"name": "fake-admin", "groups": ["system:masters"]}, **users}
        return dict(self.control("PUT", "/_fake/rbac", {"objects": objects, "users": table}))

    def clear_rbac(self) -> dict[str, Any]:
        return dict(self.control("DELETE", "/_fake/rbac"))

    def drop_watches(self) -> int:
        return int(self.control("POST", "/_fake/drop-watches")["dropped"])

    def partition(self) -> None:
        self.control("POST", "/_fake/partition")

    def heal(self) -> None:
        self.control("POST", "/_fake/heal")

    def compact(self) -> int:
        return int(self.control("POST", "/_fake/compact")["floor"])

    def requests(self) -> list[dict[str, Any]]:
        return list(self.control("GET", "/_fake/requests"))

    def clear_requests(self) -> None:
        self.control("DELETE", "/_fake/requests")

    def state(self) -> dict[str, Any]:
        return dict(self.control("GET", "/_fake/state"))

    # -- the API as an admin uses it ------------------------------------------------------------

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        )
        return body if status == 200 else None

    def delete_lease(self, namespace: str, name: str) -> int:
        status, _ = self.request(
            "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        )
        return status

    def create_pod(self, namespace: str, name: str, labels: dict[str, str] | None = None) -> Any:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": "demo"}},
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1.0"}]},
        }
        status, answer = self.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
        if status != 201:
            raise RuntimeError(f"create pod {name}: {status} {answer}")
        return answer

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return body if status == 200 else None

    def pod_labels(self, namespace: str, name: str) -> dict[str, str]:
        pod = self.pod(namespace, name)
        return dict((pod or {}).get("metadata", {}).get("labels", {}))

    def pods(self, namespace: str, label_selector: str = "") -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"labelSelector": label_selector}) if label_selector else ""
        status, body = self.request("GET", f"/api/v1/namespaces/{namespace}/pods?{query}")
        assert status == 200, body
        return list(body["items"])

    def events(self, namespace: str, field_selector: str = "") -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"fieldSelector": field_selector}) if field_selector else ""
        status, body = self.request("GET", f"/api/v1/namespaces/{namespace}/events?{query}")
        assert status == 200, body
        return list(body["items"])


class FakeKubeProcess(FakeKubeClient):
    """``python -m tests.fakekube`` on free ports; `stop` ends it."""

    def __init__(self, proc: subprocess.Popen[str], info: dict[str, Any]) -> None:
        super().__init__(info["url"], info["control_url"])
        self.proc = proc
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls, timeout: float = 15.0, *, port: int = 0, control_port: int = 0
    ) -> FakeKubeProcess:
        """On free ports, or on given ones (a restart of the "same" API server, empty)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        ports = ["--port", str(port), "--control-port", str(control_port)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakekube", *ports],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        result: dict[str, Any] = {}

        def first_line() -> None:
            assert proc.stdout is not None
            result["line"] = proc.stdout.readline()

        reader = threading.Thread(target=first_line, daemon=True)
        reader.start()
        reader.join(timeout)
        line = result.get("line", "")
        if not line.startswith("{"):
            proc.kill()
            raise RuntimeError(f"the fake API server did not start: {line!r}")
        return cls(proc, json.loads(line))

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip("\n"))

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextlib.contextmanager
def fake_kube_process() -> Iterator[FakeKubeProcess]:
    fake = FakeKubeProcess.start()
    try:
        yield fake
    finally:
        fake.stop()
