"""A real Prometheus server on a loopback port, with its own config and data directory, and
the few HTTP API calls the tests make."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def poll(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.25) -> T:
    """``probe()``'s first truthy answer, or fail after ``timeout`` seconds saying ``what``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what} (last: {last!r})")
        time.sleep(every)


class Prometheus:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; a PromQL error fails the test with Prometheus's message."""
        try:
            data = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{expr}: {error.read().decode()}") from None
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts."""
        alerts: list[dict[str, Any]] = self.get("/api/v1/alerts")["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        groups = self.get("/api/v1/rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def metric_names(self) -> set[str]:
        return set(self.get("/api/v1/label/__name__/values"))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@contextlib.contextmanager
def prometheus(
    binary: str,
    workdir: Path,
    targets: Sequence[str],
    rule_files: Sequence[Path],
    interval: str = "1s",
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (host:port, path /metrics) every ``interval`` and
    evaluating ``rule_files`` as often."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "leader-sidecar",
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    log = workdir / "prometheus.log"
    for _ in range(3):  # a free port can be taken between finding it and binding it
        port = free_port()
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
            )
        server = Prometheus(proc, f"http://127.0.0.1:{port}", log)
        try:
            poll(lambda s=server: s.ready() or s.proc.poll() is not None, 20, "Prometheus ready")
        except AssertionError:
            proc.kill()
            proc.wait(5)
            raise
        if proc.poll() is None:
            break
    else:
        raise AssertionError("Prometheus did not start:\n" + server.log_tail())
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
