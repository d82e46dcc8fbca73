"""Writes the client gave up on are still applied: the ``late`` and ``freeze`` faults the chaos
suite uses to reproduce an API server that resumes and applies a renewal nobody waits for."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakekube import FakeApiServer, running

LEASES = "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
LEASE_BODY = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "late"},
    "spec": {"holderIdentity": "a_1", "leaseDurationSeconds": 1, "leaseTransitions": 1},
}
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    async with running() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as session:
        yield session


async def holder(http: aiohttp.ClientSession, fake: FakeApiServer) -> Any:
    async with http.get(fake.url + LEASES + "/late") as response:
        return (await response.json())["spec"]["holderIdentity"]


async def patch_holder(
    http: aiohttp.ClientSession, fake: FakeApiServer, name: str, timeout: float
) -> int:
    async with http.patch(
        fake.url + LEASES + "/late",
        data=json.dumps({"spec": {"holderIdentity": name}}),
        headers=MERGE,
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as response:
        return response.status


async def until_holder(
    http: aiohttp.ClientSession, fake: FakeApiServer, name: str, timeout: float
) -> float:
    """Wall seconds until the Lease names ``name`` (fails after ``timeout``)."""
    started = time.monotonic()
    while await holder(http, fake) != name:
        assert time.monotonic() - started < timeout, f"holder never became {name}"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_late_write_is_applied_after_the_client_gave_up(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake.url + LEASES, json=LEASE_BODY) as response:
        assert response.status == 201
    fake.faults = fake.faults.parse(
        {"late": [{"delay": 0.6, "count": 1, "match": {"verbs": ["patch"]}}]}
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await patch_holder(http, fake, "b_2", timeout=0.1)
    assert await holder(http, fake) == "a_1"  # not yet: the client saw only a timeout
    waited = await until_holder(http, fake, "b_2", timeout=3)
    assert time.monotonic() - started >= 0.6 - 0.02
    assert waited > 0.3
    # count=1: the next write is served at once.
    assert await patch_holder(http, fake, "c_3", timeout=1) == 200
    assert await holder(http, fake) == "c_3"
    assert fake.faults.describe()["late"] == [{"delay": 0.6, "remaining": 0, "held": 1}]


async def test_a_frozen_server_holds_requests_and_applies_them_in_order_on_resume(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake.url + LEASES, json=LEASE_BODY) as response:
        assert response.status == 201
    fake.faults = fake.faults.parse({"freeze": True, "freeze_match": {"resources": ["leases"]}})
    with pytest.raises(TimeoutError):  # given up on, still held
        await patch_holder(http, fake, "b_2", timeout=0.1)
    second = asyncio.create_task(patch_holder(http, fake, "c_3", timeout=5))
    reading = asyncio.create_task(holder(http, fake))
    await asyncio.sleep(0.3)
    assert not second.done()
    assert not reading.done()
    fake.faults = fake.faults.parse({})
    assert await asyncio.wait_for(second, 3) == 200
    assert await asyncio.wait_for(reading, 3) in ("a_1", "b_2", "c_3")
    # Both writes were applied, the abandoned one first.
    assert await holder(http, fake) == "c_3"
    patches = [r for r in fake.requests if r["verb"] == "patch"]
    assert [r["status"] for r in patches] == [200, 200]
