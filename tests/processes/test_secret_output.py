"""A password in the store URL appears in no log line, no API answer and no metric of a
running sidecar, also while the store fails and in the SIGUSR1 state dump (issue 12)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket

import aiohttp
import pytest

from tests.support.sidecars import SidecarProcess

pytestmark = pytest.mark.slow

SECRET = "s3cret-Pa55w0rd"


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scheme", ["redis", "etcd", "postgresql"])
async def test_no_password_reaches_logs_answers_or_metrics(scheme: str) -> None:
    path = {"redis": "/0", "postgresql": "/app"}.get(scheme, "")
    store = f"{scheme}://app:{SECRET}@127.0.0.1:{unused_port()}{path}"  # nothing listens there
    await no_secret_in_output(store)


@pytest.mark.parametrize("where", ["url", "parameter", "PGPASSWORD"])
async def test_no_postgresql_password_is_printed_when_the_server_refuses_it(where: str) -> None:
    """A real server refusing the password (authentication failed): the password, wherever
    it came from, is in no log line, answer or metric."""
    from tests.postgresql.servers import shared_server

    server = await asyncio.to_thread(shared_server)
    base = f"postgresql://app@127.0.0.1:{server.port}/postgres"
    store, env = {
        "url": (base.replace("app@", f"app:{SECRET}@"), {}),
        "parameter": (f"{base}?password={SECRET}", {}),
        "PGPASSWORD": (base, {"PGPASSWORD": SECRET}),
    }[where]
    await no_secret_in_output(store, env)


async def no_secret_in_output(store: str, env: dict[str, str] | None = None) -> None:
    sidecar = SidecarProcess.start(
        "a", store, lease_duration="1s", env={"PYTHONWARNINGS": "", **(env or {})}
    )
    try:
        sidecar.wait_log(lambda e: e.get("level") in ("warning", "error"))  # the store fails
        bodies = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            # The candidates' beat may fail (and log) before the election's first request
            # does: wait until /readyz carries the election's error too.
            for _ in range(100):
                async with session.get(f"http://{sidecar.public}/readyz") as response:
                    if (await response.json())["last_error"]:
                        break
                await asyncio.sleep(0.05)
            for url in (
                f"http://{sidecar.local}/leader",
                f"http://{sidecar.public}/leader",
                f"http://{sidecar.public}/readyz",
                f"http://{sidecar.public}/healthz",
                f"http://{sidecar.public}/metrics",
            ):
                async with session.get(url) as response:
                    bodies.append(await response.text())
        sidecar.signal(signal.SIGUSR1)
        sidecar.wait_log(lambda e: e.get("msg") == "state")
        sidecar.terminate()
        assert sidecar.wait_exit(5) == 0
        sidecar.wait_log(lambda e: e.get("msg") == "stopped")
        everything = "\n".join([*sidecar.raw, *bodies])
        assert json.loads(bodies[2])["last_error"], "the store's error is part of what we check"
        assert SECRET not in everything
    finally:
        sidecar.stop()
