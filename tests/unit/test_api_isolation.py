"""Renewals cannot be delayed by the API (issue 10): the listeners run on their own thread and
event loop. The proof stalls the listeners' loop outright — a stand-in for a flood of
requests, thousands of long-polls or a slow scrape — for several leases, and counts the
leader's renewals meanwhile: on one shared loop there would be none, and a demotion."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path

import aiohttp

from sidecar.app import Sidecar
from sidecar.config import load

LEASE = 0.9
STALL = 3 * LEASE


def renewals(sidecar: Sidecar) -> float:
    value = sidecar.registry.get_sample_value(
        "leader_sidecar_renewal_gap_seconds_count",
        {"lease": sidecar.config.lease_ref, "lease_group": sidecar.config.lease_ref},
    )
    return value or 0.0


def demotions(sidecar: Sidecar) -> float:
    total = 0.0
    for reason in ("lost", "deadline", "released", "shutdown"):
        value = sidecar.registry.get_sample_value(
            "leader_sidecar_demotions_total",
            {
                "lease": sidecar.config.lease_ref,
                "lease_group": sidecar.config.lease_ref,
                "reason": reason,
            },
        )
        total += value or 0.0
    return total


async def test_a_stalled_api_loop_delays_no_renewal(tmp_path: Path) -> None:
    config = load(
        [
            "--store", f"sqlite:///{tmp_path / 'leases.db'}",
            "--lease-duration", f"{LEASE}s",
            "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0",
        ],
        environ={},
    )  # fmt: skip
    sidecar = Sidecar(config)
    await sidecar.start()
    try:
        deadline = time.monotonic() + 10
        while not sidecar.elector.is_leader():
            assert time.monotonic() < deadline, "never became leader"
            await asyncio.sleep(0.02)
        assert sidecar.api_thread is not None
        assert sidecar.api_thread.loop is not asyncio.get_running_loop()
        before = renewals(sidecar)
        stalled = threading.Event()
        sidecar.api_thread.loop.call_soon_threadsafe(lambda: (stalled.set(), time.sleep(STALL)))
        assert await asyncio.to_thread(stalled.wait, 5)
        # While the listeners' loop sleeps, the election renews as usual.
        await asyncio.sleep(STALL - 0.2)
        expected = int((STALL - 0.2) / config.timing.renew_interval) - 1
        assert renewals(sidecar) - before >= expected
        assert sidecar.elector.is_leader()
        assert demotions(sidecar) == 0
        # ...and the listeners answer again once their loop is free.
        address = sidecar.addresses["local"]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{address}/leader") as response,
        ):
            assert response.status == 200
    finally:
        await sidecar.stop()


async def test_what_start_up_made_is_out_of_the_collectors_reach(tmp_path: Path) -> None:
    """A full garbage collection walks every tracked object: 20-50 ms over what start-up
    made (the imported modules, most of it), and it landed on hand-offs. Start-up ends by
    freezing all of it, so a later collection walks only what was made since."""
    config = load(
        [
            "--store", f"sqlite:///{tmp_path / 'leases.db'}",
            "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0",
        ],
        environ={},
    )  # fmt: skip
    gc.unfreeze()
    sidecar = Sidecar(config)
    await sidecar.start()
    try:
        assert gc.get_freeze_count() > 10_000
    finally:
        await sidecar.stop()
        gc.unfreeze()
