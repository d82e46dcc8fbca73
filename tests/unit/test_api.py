"""The HTTP API in process: a real aiohttp server on a free port, an elector on the memory store."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.api import create_local_app, create_public_app
from sidecar.backends.base import StoreUnavailable
from sidecar.backends.memory import MemoryLeaseState
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.timing import Timing
from tests.support.strict_store import StrictStore

TIMING = Timing.build(lease_duration=2.0)
RELEASE = {"X-Leader-Sidecar": "release"}  # what tells a local program from a web page
FIELDS = {
    "leader",
    "identity",
    "holder",
    "term",
    "lease",
    "lease_duration_seconds",
    "valid_for_seconds",
    "since",
}


def make_elector(state: MemoryLeaseState, name: str) -> Elector:
    registry = CollectorRegistry()
    return Elector(
        StrictStore(state),
        TIMING,
        f"{name}_1234",
        "default",
        metrics=Metrics(registry, "default", TIMING.lease_duration),
    )


Pair = tuple[Elector, Elector, MemoryLeaseState]


@pytest.fixture
async def pair() -> Pair:
    state = MemoryLeaseState()
    return make_elector(state, "a"), make_elector(state, "b"), state


async def client_for(app: web.Application) -> TestClient[web.Request, web.Application]:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_leader_answers_503_starting_until_the_store_has_answered(pair: Pair) -> None:
    """Before the store has answered about the lease (not open yet, or failing), ``/leader``
    is 503 with ``"starting": true`` and no holder: never a leader's answer, and not the
    answer of a free lease either, which comes once the store has said so."""
    a, b, _ = pair
    assert isinstance(a.store, StrictStore)
    a.store.fail_next("acquire", StoreUnavailable("not open yet"))
    async with await client_for(create_local_app(a)) as client:

        async def answer() -> tuple[int, dict[str, object]]:
            response = await client.get("/leader")
            return response.status, await response.json()

        for step in range(2):  # before any request, and after one that failed
            status, body = await answer()
            assert status == 503, step
            assert set(body) == FIELDS | {"starting"}, step
            assert (body["starting"], body["leader"], body["holder"]) == (True, False, None)
            await a.step()
        assert a.store.calls == {"acquire": 1, "read": 1}
        status, body = await answer()  # the store has shown a free lease
        assert (status, set(body), body["holder"]) == (503, FIELDS, None)
        await a.step()
        status, body = await answer()
        assert (status, set(body), body["leader"]) == (200, FIELDS, True)
    await b.step()  # a follower that has seen the holder
    assert b.status().starting is False
    assert "starting" not in b.status().to_json()


async def test_leader_answers_200_with_the_documented_json_and_an_etag(pair: Pair) -> None:
    a, b, _ = pair
    await a.step()
    await b.step()
    async with (
        await client_for(create_local_app(a)) as leader,
        await client_for(create_local_app(b)) as follower,
    ):
        response = await leader.get("/leader")
        body = await response.json()
        assert response.status == 200
        assert set(body) == FIELDS
        assert body["leader"] is True
        assert body["identity"] == body["holder"] == "a_1234"
        assert body["term"] == 1
        assert body["lease"] == "default"
        assert 0 < body["valid_for_seconds"] <= TIMING.lease_duration
        assert body["since"].endswith("Z")
        assert response.headers["ETag"].startswith('"')
        assert response.headers["Cache-Control"] == "no-store"

        response = await follower.get("/leader")
        body = await response.json()
        assert response.status == 503
        assert body["leader"] is False
        assert body["holder"] == "a_1234"
        assert body["term"] == 1
        assert body["valid_for_seconds"] == 0


async def test_a_long_poll_returns_within_milliseconds_of_a_change(pair: Pair) -> None:
    a, b, _ = pair
    await a.step()
    await b.step()
    async with await client_for(create_local_app(b)) as follower:
        first = await follower.get("/leader")
        etag = first.headers["ETag"]
        poll = asyncio.create_task(
            follower.get("/leader", params={"wait": "10s"}, headers={"If-None-Match": etag})
        )
        await asyncio.sleep(0.2)
        assert not poll.done(), "the long poll answered before anything changed"
        released_at = time.monotonic()
        await a.release()
        b.on_watch(await a.store.read())
        await b.step()
        response = await asyncio.wait_for(poll, timeout=2)
        assert time.monotonic() - released_at < 0.5
        assert response.status == 200
        assert response.headers["ETag"] != etag
        assert (await response.json())["term"] == 2


async def test_a_long_poll_with_a_stale_etag_answers_at_once(pair: Pair) -> None:
    a, _, _ = pair
    await a.step()
    async with await client_for(create_local_app(a)) as client:
        started = time.monotonic()
        response = await client.get(
            "/leader", params={"wait": "30"}, headers={"If-None-Match": '"something-else"'}
        )
        assert response.status == 200
        assert time.monotonic() - started < 0.5


async def test_a_long_poll_with_nothing_changing_answers_when_the_wait_ends(pair: Pair) -> None:
    a, b, _ = pair
    await a.step()
    await b.step()
    async with await client_for(create_local_app(b)) as client:
        etag = (await client.get("/leader")).headers["ETag"]
        started = time.monotonic()
        response = await client.get(
            "/leader", params={"wait": "300ms"}, headers={"If-None-Match": etag}
        )
        elapsed = time.monotonic() - started
        assert response.status == 503
        assert response.headers["ETag"] == etag
        assert 0.25 <= elapsed < 2


async def test_a_long_poll_on_the_leader_ends_at_its_deadline(pair: Pair) -> None:
    """Even with no loop running and no store call, the deadline changes the answer."""
    a, _, _ = pair
    await a.step()
    async with await client_for(create_local_app(a)) as client:
        etag = (await client.get("/leader")).headers["ETag"]
        response = await client.get(
            "/leader", params={"wait": "10"}, headers={"If-None-Match": etag}
        )
        assert response.status == 503
        assert response.headers["ETag"] != etag


async def test_a_bad_wait_is_refused_with_a_message(pair: Pair) -> None:
    a, _, _ = pair
    async with await client_for(create_local_app(a)) as client:
        response = await client.get(
            "/leader", params={"wait": "soon"}, headers={"If-None-Match": '"x"'}
        )
        assert response.status == 400
        assert "wait must be 0 or a duration" in (await response.json())["error"]


async def test_events_stream_the_state_and_every_change(pair: Pair) -> None:
    a, _, _ = pair
    async with await client_for(create_local_app(a)) as client:
        response = await client.get("/events")
        assert response.headers["Content-Type"].startswith("text/event-stream")

        async def next_event() -> str:
            lines = []
            while True:
                line = (await response.content.readline()).decode()
                if line == "\n":
                    return "".join(lines)
                lines.append(line)

        first = await asyncio.wait_for(next_event(), 2)
        assert '"leader":false' in first
        await a.step()
        second = await asyncio.wait_for(next_event(), 2)
        assert "event: leader" in second
        assert '"leader":true' in second
        assert '"term":1' in second
        response.close()


async def test_release_steps_down_and_is_only_on_the_localhost_listener(pair: Pair) -> None:
    a, b, _ = pair
    await a.step()
    public = create_public_app(a, a.metrics.registry, dict)
    async with await client_for(public) as outside, await client_for(create_local_app(a)) as inside:
        refused = await outside.post("/leader/release")
        assert refused.status in (404, 405)
        assert a.status().leader
        response = await inside.post("/leader/release", headers=RELEASE)
        body = await response.json()
        assert response.status == 200
        assert body["released"] is True
        assert body["leader"] is False
        await b.step()
        assert b.status().leader
        again = await inside.post("/leader/release", headers=RELEASE)
        assert (await again.json())["released"] is False


async def test_probes_and_metrics_on_the_public_listener(pair: Pair) -> None:
    a, _, _ = pair
    alive = [True]
    public = create_public_app(
        a, a.metrics.registry, lambda: {} if alive[0] else {"election": "stopped"}
    )
    async with await client_for(public) as client:
        assert (await client.get("/readyz")).status == 503  # the store has not answered yet
        await a.step()
        assert (await client.get("/readyz")).status == 200
        assert (await client.get("/healthz")).status == 200
        leader = await client.get("/leader")
        assert leader.status == 200
        metrics = await (await client.get("/metrics")).text()
        assert 'leader_sidecar_is_leader{lease="default",lease_group="default"} 1.0' in metrics
        assert 'leader_sidecar_term{lease="default",lease_group="default"} 1.0' in metrics
        assert 'leader_election_master_status{name="default"} 1.0' in metrics
        alive[0] = False
        assert (await client.get("/healthz")).status == 503


async def test_readyz_fails_when_the_store_stops_answering_for_a_lease(pair: Pair) -> None:
    """Readiness follows the store, not leadership: a follower that hears the store is ready."""
    a, b, _ = pair
    await a.step()
    await b.step()
    public = create_public_app(b, b.metrics.registry, dict)
    async with await client_for(public) as client:
        assert (await client.get("/readyz")).status == 200
        assert isinstance(b.store, StrictStore)
        b.store.fail_always("acquire", StoreUnavailable("down"))
        b._last_store_answer -= TIMING.lease_duration + 0.1  # as if a lease had passed
        await a.release()  # so b tries the store at once
        b.on_watch(await a.store.read())
        await b.step()
        response = await client.get("/readyz")
        assert response.status == 503
        assert "down" in (await response.json())["last_error"]


async def test_the_api_answers_while_a_store_call_hangs(pair: Pair) -> None:
    """/leader never waits for the store."""
    a, _, _ = pair
    await a.step()
    hang = asyncio.Event()

    async def slow_renew(*args: object) -> None:
        await hang.wait()

    a.store.renew = slow_renew  # type: ignore[method-assign, assignment]
    renewing = asyncio.create_task(a.step())
    async with await client_for(create_local_app(a)) as client:
        started = time.monotonic()
        response = await client.get("/leader")
        assert time.monotonic() - started < 0.2
        assert response.status == 200
    hang.set()
    await renewing
