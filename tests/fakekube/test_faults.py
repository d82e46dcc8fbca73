"""The fake's fault injection does what the tests of the Kubernetes store rely on."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakekube import FakeApiServer, fake_kube_process, running

RECORDED = Path(__file__).parent / "recorded"

LEASES = "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
LEASE_BODY = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": "faulty"},
    "spec": {"holderIdentity": "a_1", "leaseDurationSeconds": 1, "leaseTransitions": 1},
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    async with running() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as session:
        yield session


async def test_latency_delays_matching_requests_only(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse({"latency": 0.4, "latency_match": {"verbs": ["get"]}})
    started = time.monotonic()
    async with http.get(fake.url + LEASES) as response:  # a list: not delayed
        assert response.status == 200
    assert time.monotonic() - started < 0.3
    started = time.monotonic()
    async with http.get(fake.url + LEASES + "/faulty") as response:
        assert response.status == 404
    assert time.monotonic() - started >= 0.4


@pytest.mark.parametrize(
    ("code", "reason"),
    [(500, "InternalError"), (503, "ServiceUnavailable"), (504, "Timeout")],
)
async def test_injected_errors_answer_a_status_a_limited_number_of_times(
    fake: FakeApiServer, http: aiohttp.ClientSession, code: int, reason: str
) -> None:
    fake.faults = fake.faults.parse(
        {"errors": [{"status": code, "count": 2, "match": {"resources": ["leases"]}}]}
    )
    answers = []
    for _ in range(3):
        async with http.get(fake.url + LEASES) as response:
            answers.append((response.status, (await response.json()).get("reason")))
            assert "Retry-After" not in response.headers  # none unless asked for
    assert answers == [(code, reason), (code, reason), (200, None)]


async def test_an_injected_429_is_the_plain_text_rejection_of_priority_and_fairness(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    """As recorded (apf.json): text/plain, not a Status, and Retry-After 1 unless given."""
    recorded = json.loads((RECORDED / "apf.json").read_text())["exchanges"][0]["response"]
    fake.faults = fake.faults.parse({"errors": [{"status": 429, "count": 1}]})
    async with http.get(fake.url + LEASES + "?watch=1") as response:
        assert response.status == 429
        assert await response.text() == recorded["body"]
        for header in ("Content-Type", "Retry-After", "X-Content-Type-Options"):
            assert response.headers[header] == recorded["headers"][header]
    fake.faults = fake.faults.parse({"errors": [{"status": 429, "retry_after": 5}]})
    for _ in range(2):
        async with http.get(fake.url + LEASES) as response:
            assert (response.status, response.headers["Retry-After"]) == (429, "5")


async def test_a_5xx_carries_retry_after_only_when_given(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse(
        {"errors": [{"status": 503, "retry_after": 7, "count": 1}, {"status": 500, "count": 1}]}
    )
    async with http.get(fake.url + LEASES) as response:
        assert (response.status, response.headers.get("Retry-After")) == (503, "7")
    async with http.get(fake.url + LEASES) as response:
        assert (response.status, response.headers.get("Retry-After")) == (500, None)


async def test_ended_watches_answer_an_empty_200_at_once_and_other_requests_are_served(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse({"end_watches": True})
    started = time.monotonic()
    async with http.get(fake.url + LEASES + "?watch=1&timeoutSeconds=30") as response:
        assert (response.status, await response.read()) == (200, b"")
    assert time.monotonic() - started < 5
    async with http.get(fake.url + LEASES) as response:
        assert response.status == 200
        assert (await response.json())["kind"] == "LeaseList"


async def test_expired_watches_answer_the_410_error_event_and_a_fresh_watch_is_served(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse({"expire_watches": True})
    async with http.get(fake.url + LEASES + "?watch=1&resourceVersion=5") as response:
        assert response.status == 200
        event = json.loads(await response.read())
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    # A watch without a resourceVersion starts from now: nothing to expire.
    url = fake.url + LEASES + "?watch=1&timeoutSeconds=1"
    async with http.get(url) as response:
        assert (response.status, await response.read()) == (200, b"")


async def test_a_redirect_fault_sends_the_client_elsewhere_with_its_path(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse(
        {"redirect": {"location": "http://elsewhere.example:6443", "status": 307}}
    )
    async with http.get(fake.url + LEASES + "?limit=1", allow_redirects=False) as response:
        assert response.status == 307
        assert response.headers["Location"] == (
            "http://elsewhere.example:6443" + LEASES + "?limit=1"
        )


async def test_the_request_log_keeps_the_clients_timeout_and_user_agent(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    headers = {"User-Agent": "leader-sidecar/9.9 (linux/x86_64)"}
    async with http.get(fake.url + LEASES + "?timeout=2500ms", headers=headers) as response:
        assert response.status == 200
    entry = fake.requests[-1]
    assert (entry["timeout"], entry["user_agent"]) == ("2500ms", headers["User-Agent"])


async def test_impersonation_headers_make_the_request_act_as_that_user(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    headers = [
        ("Impersonate-User", "alice"),
        ("Impersonate-Group", "team-a"),
        ("Impersonate-Group", "team-b"),
        ("Impersonate-Extra-Scopes", "view"),
    ]
    async with http.get(fake.url + LEASES, headers=headers) as response:
        assert response.status == 200
    entry = fake.requests[-1]
    assert (entry["user"], entry["impersonated_by"]) == ("alice", fake.user)
    assert entry["impersonation"]["groups"] == ["team-a", "team-b"]
    assert entry["impersonation"]["extra"] == {"scopes": ["view"]}
    async with http.get(fake.url + LEASES, headers={"Impersonate-Group": "x"}) as response:
        assert response.status == 500  # groups without a user: refused, as the real filter does


async def test_an_injected_conflict_is_the_real_conflict_and_changes_nothing(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake.url + LEASES, json=LEASE_BODY) as response:
        created = await response.json()
    fake.faults = fake.faults.parse({"errors": [{"status": 409, "count": 1}]})
    patch = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "spec": {"holderIdentity": "b_1"},
    }
    headers = {"Content-Type": "application/merge-patch+json"}
    async with http.patch(
        fake.url + LEASES + "/faulty", data=json.dumps(patch), headers=headers
    ) as response:
        body = await response.json()
        assert response.status == 409
        assert body["reason"] == "Conflict"
        assert "the object has been modified" in body["message"]
    async with http.get(fake.url + LEASES + "/faulty") as response:
        assert (await response.json())["metadata"]["resourceVersion"] == created["metadata"][
            "resourceVersion"
        ]


async def test_forbid_answers_the_rbac_refusal(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    fake.faults = fake.faults.parse({"forbid": [{"verbs": ["patch"], "resources": ["pods"]}]})
    async with http.patch(
        fake.url + "/api/v1/namespaces/demo/pods/app-0",
        data="{}",
        headers={"Content-Type": "application/merge-patch+json"},
    ) as response:
        body = await response.json()
    assert response.status == 403
    assert body["message"] == (
        'pods "app-0" is forbidden: User "system:serviceaccount:default:leader-sidecar" cannot '
        'patch resource "pods" in API group "" in the namespace "demo"'
    )


async def read_events(response: aiohttp.ClientResponse) -> list[dict[str, object]]:
    events = []
    while True:
        line = await response.content.readline()
        if not line:
            return events
        events.append(json.loads(line))


async def test_dropping_watches_cuts_the_stream_mid_flight(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(fake.url + LEASES + "?watch=1&fieldSelector=metadata.name%3Dfaulty") as r:
        reading = asyncio.create_task(read_events(r))
        await asyncio.sleep(0.2)
        assert fake.drop_watches() == 1
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(reading, 5)


async def test_a_resumed_watch_from_before_a_compaction_gets_410(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake.url + LEASES, json=LEASE_BODY) as response:
        version = (await response.json())["metadata"]["resourceVersion"]
    fake.cluster.bump()
    fake.cluster.compact()
    url = fake.url + LEASES + f"?watch=1&resourceVersion={int(version) - 1}"
    async with http.get(url) as response:
        assert response.status == 200
        events = await asyncio.wait_for(read_events(response), 5)
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410  # type: ignore[index]


async def test_a_partition_refuses_connections_and_healing_restores_the_same_port(
    fake: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(fake.url + LEASES + "?watch=1") as watch:
        reading = asyncio.create_task(read_events(watch))
        await asyncio.sleep(0.1)
        await fake.partition()
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(reading, 5)
    fresh = aiohttp.ClientSession()
    try:
        with pytest.raises(aiohttp.ClientConnectorError):
            await fresh.get(fake.url + LEASES)
        async with http.get(fake.control_url + "/_fake/state") as response:
            assert (await response.json())["partitioned"] is True
        await fake.heal()
        async with fresh.get(fake.url + LEASES) as response:
            assert response.status == 200
    finally:
        await fresh.close()


def test_the_control_port_drives_a_fake_in_another_process() -> None:
    """Faults, partition and heal through the control port of ``python -m tests.fakekube``."""
    with fake_kube_process() as fake:
        status, _ = fake.request("GET", LEASES)
        assert status == 200
        fake.set_faults(errors=[{"status": 500, "count": 1}])
        assert fake.request("GET", LEASES)[0] == 500
        assert fake.request("GET", LEASES)[0] == 200
        fake.partition()
        with pytest.raises(urllib.error.URLError, match="Connection refused"):
            fake.request("GET", LEASES, timeout=2)
        fake.heal()
        assert fake.request("GET", LEASES)[0] == 200
        verbs = [r["verb"] for r in fake.requests()]
        assert verbs.count("list") == 4  # the refused one never arrived
