"""A real sidecar listening on a host name answers on every address that name resolves to."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import pytest

from tests.support.sidecars import SidecarProcess

pytestmark = pytest.mark.slow


async def test_listen_localhost_answers_on_every_address_localhost_resolves_to(
    tmp_path: Path,
) -> None:
    """``--listen localhost:0``: whichever address of localhost a client tries (127.0.0.1, and
    ::1 where the host resolves it), the sidecar answers, on the one port it logged."""
    proc = SidecarProcess.start(
        "a", f"sqlite:///{tmp_path / 'leases.db'}", args=["--listen", "localhost:0"]
    )
    try:
        port = int(proc.local.rsplit(":", 1)[1])
        listening = proc.wait_log(
            lambda e: e.get("msg") == "listening" and e["listener"] == "local"
        )
        infos = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
        hosts = list(dict.fromkeys(str(info[4][0]) for info in infos))
        assert hosts
        assert listening["addresses"] == [
            f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts
        ]
        async with aiohttp.ClientSession() as session:
            for host in hosts:
                url = (
                    f"http://[{host}]:{port}/leader"
                    if ":" in host
                    else f"http://{host}:{port}/leader"
                )
                async with session.get(url) as response:
                    assert response.status in (200, 503), host
                    assert (await response.json())["identity"] == proc.identity
    finally:
        proc.stop()
