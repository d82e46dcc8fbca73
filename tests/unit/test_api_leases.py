"""The API of a sidecar with several leases: ``/leader/{lease}``, ``/leases`` (long-poll over
the set), ``/events`` over the set, ``POST /leader/transfer`` — against real aiohttp servers
and two replicas on the in-memory store."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.api import create_local_app, create_public_app
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.lease_set import LeaseSet
from sidecar.metrics import Metrics
from sidecar.timing import Timing

TIMING = Timing.build(1.0, 0.2, 0.2, 0.1)
NAMES = ["jobs-0", "jobs-1", "jobs-2", "jobs-3"]
LOCAL = {"X-Leader-Sidecar": "1"}


async def client_for(app: web.Application) -> TestClient[web.Request, web.Application]:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def lease_set(server: MemoryServer, name: str) -> LeaseSet:
    registry = CollectorRegistry()
    return LeaseSet.open(
        MemoryStoreClient(server),
        [(n, n) for n in NAMES],
        TIMING,
        f"{name}_0000",
        group="jobs",
        registry_metrics=lambda lease: Metrics(registry, lease, TIMING.lease_duration),
        stand_back=0.3,
    )


@pytest.fixture
async def two() -> AsyncIterator[tuple[LeaseSet, LeaseSet]]:
    server = MemoryServer()
    a, b = lease_set(server, "a"), lease_set(server, "b")
    tasks = []
    for s in (a, b):
        await s.prime(0.1)
        tasks.append(asyncio.create_task(s.run()))
    deadline = time.monotonic() + 5
    while sorted([len(a.held()), len(b.held())]) != [2, 2]:
        assert time.monotonic() < deadline, (a.held(), b.held())
        await asyncio.sleep(0.02)
    yield a, b
    for s in (a, b):
        s.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_each_lease_answers_on_its_own_path_and_plain_leader_says_where_to_ask(
    two: tuple[LeaseSet, LeaseSet],
) -> None:
    a, _ = two
    async with await client_for(create_local_app(a)) as client:
        plain = await client.get("/leader")
        assert plain.status == 400
        assert "/leader/jobs-0" in (await plain.json())["error"]
        for name in NAMES:
            answer = await client.get(f"/leader/{name}")
            body = await answer.json()
            assert answer.status == (200 if name in a.held() else 503)
            assert body["lease"] == name
            assert body["leader"] == (name in a.held())
        missing = await client.get("/leader/" + "x" * 5000)
        assert missing.status == 404
        assert "x" * 50 not in await missing.text()


async def test_leases_lists_every_lease_and_long_polls_over_the_whole_set(
    two: tuple[LeaseSet, LeaseSet],
) -> None:
    a, b = two
    async with await client_for(create_public_app(a, CollectorRegistry(), dict)) as c:
        first = await c.get("/leases")
        body = await first.json()
        assert [entry["lease"] for entry in body["leases"]] == NAMES
        assert body["held"] == 2
        assert {x["identity"] for x in body["candidates"]} == {
            "a_0000",
            "b_0000",
        }
        etag = first.headers["ETag"]
        unchanged = await c.get("/leases", params={"wait": "0.2"}, headers={"If-None-Match": etag})
        assert unchanged.headers["ETag"] == etag
        # b hands one of its leases to a: the long-poll on a's set returns within milliseconds.
        poll = asyncio.create_task(
            c.get("/leases", params={"wait": "5"}, headers={"If-None-Match": etag})
        )
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await b.transfer(b.held()[0], "a")
        answer = await poll
        assert time.monotonic() - started < 1.0
        assert answer.headers["ETag"] != etag


async def test_events_cover_every_lease(two: tuple[LeaseSet, LeaseSet]) -> None:
    a, b = two
    async with await client_for(create_local_app(a)) as client:
        response = await client.get("/events")
        seen: list[dict] = []

        async def read_events(count: int) -> None:
            while len(seen) < count:
                line = await response.content.readline()
                if line.startswith(b"data: "):
                    seen.append(json.loads(line[6:]))

        await asyncio.wait_for(read_events(len(NAMES)), 2)
        assert sorted(e["lease"] for e in seen) == NAMES
        moved = b.held()[0]
        await b.transfer(moved, "a")
        await asyncio.wait_for(read_events(len(NAMES) + 1), 2)
        assert any(e["lease"] == moved for e in seen[len(NAMES) :])
        response.close()


async def test_transfer_needs_a_local_program_and_a_successor(
    two: tuple[LeaseSet, LeaseSet],
) -> None:
    a, b = two
    async with await client_for(create_local_app(a)) as client:
        page = await client.post("/leader/transfer", data='{"to": "b"}')  # text/plain: a page
        assert page.status == 403
        nobody = await client.post("/leader/transfer", json={})
        assert nobody.status == 400
        assert "any" in (await nobody.json())["error"]
        unknown = await client.post("/leader/transfer", json={"to": "zed"})
        assert unknown.status == 409
        assert "b_0000" in (await unknown.json())["error"]
        huge = await client.post("/leader/transfer", json={"to": "b" * 10000})
        assert huge.status == 413
        moved = a.held()[0]
        done = await client.post("/leader/transfer", json={"to": "b", "lease": moved})
        assert done.status == 200
        assert await done.json() == {"transferred": [moved], "successor": "b_0000"}
        deadline = time.monotonic() + 1
        while moved not in b.held():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        released = await client.post("/leader/release", json={"lease": a.held()[0]}, headers=LOCAL)
        assert released.status == 200
        assert len(a.held()) == 0
