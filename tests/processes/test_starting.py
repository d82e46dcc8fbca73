"""A real sidecar whose store accepts connections and never answers (a server still starting,
a black hole): its ``/leader`` answers at once, 503 with ``"starting": true``, and keeps
answering so; it never claims. One process per network store."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_ports
from tests.support.sidecars import REPO, SidecarProcess


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port whose connections the kernel accepts (up to the backlog) and nobody answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


STORES = {
    "redis": "redis://127.0.0.1:{port}/0",
    "postgresql": "postgresql://sidecar:secret@127.0.0.1:{port}/app",
    "etcd": "etcd://127.0.0.1:{port}/app",
    "zookeeper": "zookeeper://127.0.0.1:{port}/app",
}


@pytest.mark.parametrize("store", sorted(STORES))
def test_a_sidecar_whose_store_never_answers_says_starting_and_never_leads(store: str) -> None:
    with silent_server() as port:
        url = STORES[store].format(port=port)
        sidecar = SidecarProcess.start("a", url, lease_duration="2s", args=["--lease", "app"])
        try:
            answers = [get(sidecar.leader_url) for _ in range(3)]
            answers.append(get(sidecar.public_leader_url))
            for status, body in answers:
                assert status == 503
                assert (body["starting"], body["leader"], body["holder"]) == (True, False, None)
            assert get(f"http://{sidecar.public}/readyz")[0] == 503  # not ready either
        finally:
            sidecar.stop()


# Runs the sidecar with the import of redis-py held until the test writes to a FIFO.
_HELD_IMPORT = """
import importlib.abc, runpy, sys

GATE = sys.argv[1]

class HoldRedis(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "redis":
            sys.meta_path.remove(self)
            with open(GATE) as gate:  # blocks until the test opens it to write
                gate.read()
        return None

sys.meta_path.insert(0, HoldRedis())
sys.argv = ["leader-sidecar", *sys.argv[2:]]
runpy.run_module("sidecar", run_name="__main__")
"""


def long_poll(url: str, etag: str) -> tuple[int, dict[str, str], dict[str, object]]:
    request = urllib.request.Request(url, headers={"If-None-Match": etag})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def wait_answering(url: str, proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    """Until ``url`` answers at all (any status)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url)
            return
        except OSError:
            assert proc.poll() is None, "the sidecar exited"
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.01)


def test_the_listeners_answer_before_the_stores_driver_is_imported(tmp_path: Path) -> None:
    """The store's driver is imported and its client built after the listeners answer:
    while redis-py's import is held, ``/leader`` says starting on both listeners, ``/healthz``
    and ``/metrics`` answer, and what needs the leases says to retry; once it is let go, the
    sidecar goes on to its (silent) store and still says starting."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    # The "listening" lines are logged once the store is open: the ports are chosen here.
    local, public = (f"127.0.0.1:{port}" for port in free_ports(2))
    with silent_server() as port:
        command = [
            sys.executable, "-c", _HELD_IMPORT, str(gate),
            "--store", f"redis://127.0.0.1:{port}/0", "--lease", "app", "--identity", "a",
            "--listen", local, "--public-listen", public,
            "--log-format", "json", "--log-level", "debug",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        sidecar = SidecarProcess(proc, "a")
        try:
            wait_answering(f"http://{public}/healthz", proc)
            for url in (f"http://{local}/leader", f"http://{public}/leader/app"):
                status, body = get(url)
                assert status == 503
                assert (body["starting"], body["leader"], body["holder"]) == (True, False, None)
                assert (body["lease"], body["term"]) == ("app", 0)
                assert str(body["identity"]).startswith("a_")
            assert get(f"http://{public}/readyz")[0] == 503
            # As until the election task runs (the store's first answer, or a request timeout).
            status, body = get(f"http://{public}/healthz")
            assert (status, body["error"]) == (503, "down: election")
            assert get(f"http://{local}/leases") == (
                503,
                {"error": "starting: the store is not open yet; retry later"},
            )
            with urllib.request.urlopen(f"http://{public}/metrics", timeout=5) as response:
                assert 'leader_sidecar_is_leader{lease="app"' in response.read().decode()
            etag = long_poll(f"http://{local}/leader?wait=60", '"another"')[1]["ETag"]
            # A long-poll on the starting answer's ETag is held until the store is open.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(long_poll, f"http://{local}/leader?wait=60", etag)
                assert not any(e.get("msg") in ("starting", "listening") for e in sidecar.logs)
                assert not held.done()
                with open(gate, "w") as opened:
                    opened.write("go")
                sidecar.wait_log(lambda e: e.get("msg") == "listening")
                status, headers, body = held.result(timeout=10)
            assert (status, headers["ETag"], body["starting"]) == (503, etag, True)
            status, body = get(f"http://{local}/leader")
            assert (status, body["starting"]) == (503, True)
        finally:
            sidecar.stop()
