"""A real sidecar whose store accepts connections and never answers (a server still starting,
a black hole): its ``/leader`` answers at once, 503 with ``"starting": true``, and keeps
answering so; it never claims. One process per network store."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.sidecars import SidecarProcess


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
