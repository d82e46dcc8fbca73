"""The fake answers recorded requests the way the real kube-apiserver v1.36 did: same status
codes, same Status bodies, same object shapes and field order (``recorded/``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakekube import FakeApiServer, running
from tests.fakekube.discovery import recorded
from tests.fakekube.replay import Replayer, exchange, shape

# Lease CRUD, conditional updates, patches, validation, list, delete: everything in leases.json
# except the setup of namespace/service account (the fake has them), server-side apply (not
# served: nothing of ours uses it), the all-namespaces list (the real cluster had kube-system
# leases of its own) and the exchanges recorded later against another incarnation of my-lease.
LEASE_SEQUENCE = [
    name
    for index, name in enumerate(recorded("leases"))
    if 2 <= index <= 78 and name != "list-all-namespaces"
]
POD_SEQUENCE = [name for name in recorded("pods") if name != "create-in-missing-namespace"]
CORE_EVENT_SEQUENCE = [
    name for index, name in enumerate(recorded("events")) if 1 <= index <= 12 and name != "core-get"
]


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    async with running() as server:
        yield server


@pytest.fixture
async def replayer(fake: FakeApiServer) -> AsyncIterator[Replayer]:
    async with aiohttp.ClientSession() as session:
        yield Replayer(session, fake.url)


async def test_the_lease_transcript_replays_with_the_same_answers(replayer: Replayer) -> None:
    """77 recorded Lease exchanges in order: codes, Status bodies, shapes, specs."""
    assert len(LEASE_SEQUENCE) > 70
    for name in LEASE_SEQUENCE:
        await replayer.replay("leases", name)


async def test_the_pod_transcript_replays_with_the_same_answers(replayer: Replayer) -> None:
    """Pod creation, every kind of label patch and its errors, list by label, delete."""
    for name in POD_SEQUENCE:
        await replayer.replay("pods", name)


async def test_a_pod_in_a_missing_namespace_is_refused_like_the_real_server(
    replayer: Replayer,
) -> None:
    await replayer.replay("pods", "create-in-missing-namespace")


async def test_core_events_replay_with_the_same_answers(replayer: Replayer) -> None:
    """core/v1 Events: create (named, generateName, minimal), validation, list by field."""
    await replayer.replay("leases", "create")  # the Lease the events are about
    for name in CORE_EVENT_SEQUENCE:
        await replayer.replay("events", name)


async def test_discovery_and_version_documents_match(replayer: Replayer) -> None:
    """What kubectl and the client read first: version and per-group discovery as recorded."""
    for name in (
        "version",
        "api-legacy",
        "group-coordination",
        "groupversion-coordination-v1",
        "groupversion-missing",
    ):
        await replayer.replay("discovery", name)


@pytest.mark.parametrize(
    ("name", "listing", "key"),
    [
        ("api-aggregated", lambda body: body["items"][0]["versions"][0]["resources"], "resource"),
        ("apis-aggregated", lambda body: body["items"], None),
        ("apis-legacy", lambda body: body["groups"], "name"),
        ("api-v1", lambda body: body["resources"], "name"),
    ],
)
async def test_discovery_lists_exactly_what_is_served_as_recorded(
    replayer: Replayer, name: str, listing: Any, key: str | None
) -> None:
    """Discovery advertises only what the fake serves (leases; pods, events, namespaces),
    each entry as the real server wrote it (core resources without their subresources)."""
    recorded_exchange = exchange("discovery", name)
    status, headers, body, _ = await replayer.send(recorded_exchange["request"])
    want = recorded_exchange["response"]
    assert status == 200
    assert headers["Content-Type"] == want["headers"]["Content-Type"]
    lists = ("items", "groups", "resources")
    assert shape({k: v for k, v in body.items() if k not in lists}) == shape(
        {k: v for k, v in want["body"].items() if k not in lists}
    )

    def name_of(entry: dict[str, Any]) -> str:
        return str(entry[key]) if key else str(entry["metadata"]["name"])

    served = {name_of(entry): entry for entry in listing(body)}
    recorded_entries = {name_of(entry): entry for entry in listing(want["body"])}
    assert set(served) in ({"events", "namespaces", "pods"}, {"coordination.k8s.io"})
    for entry_name, entry in served.items():
        expected = dict(recorded_entries[entry_name])
        expected.pop("subresources", None)
        assert entry == expected


async def test_aggregated_discovery_answers_304_to_its_own_etag(replayer: Replayer) -> None:
    status, headers, _, _ = await replayer.send(exchange("discovery", "apis-aggregated")["request"])
    assert status == 200
    request = exchange("discovery", "apis-aggregated-if-none-match")["request"]
    request["headers"]["If-None-Match"] = headers["Etag"]
    status, headers, body, _ = await replayer.send(request)
    assert (status, body) == (304, None)
    assert headers["Cache-Control"] == "public"


async def test_the_openapi_document_kubectl_apply_needs_is_served_whole(
    replayer: Replayer,
) -> None:
    root = exchange("discovery", "openapi-v3-root")
    status, headers, body, _ = await replayer.send(root["request"])
    assert status == 200
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    url = body["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
    assert (
        url == root["response"]["body"]["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
    )
    document = await replayer.replay("discovery", "openapi-v3-coordination-v1")
    assert document == exchange("discovery", "openapi-v3-coordination-v1")["response"]["body"]


async def test_rbac_refusals_have_the_recorded_wording(fake: FakeApiServer) -> None:
    """403 for a user without a Role (per verb, per scope), 401 for an unknown token, 403 for
    anonymous when anonymous access is off."""
    fake.user = "alice"
    fake.faults = fake.faults.parse({"forbid": [{}]})
    async with aiohttp.ClientSession() as session:
        replayer = Replayer(session, fake.url)
        for name in (
            "alice-get-lease",
            "alice-get-missing-lease",
            "alice-list-leases",
            "alice-watch-leases",
            "alice-update-lease",
            "alice-create-lease",
            "alice-patch-pod",
            "alice-cluster-scope-list",
        ):
            await replayer.replay("rbac", name)
        await replayer.replay("rbac", "alice-version")
        await replayer.replay("rbac", "alice-api-discovery")
        fake.tokens = {"the-only-token"}
        await replayer.replay("rbac", "bad-token")
        fake.tokens = None
        fake.anonymous = False
        fake.user = "nobody"
        await replayer.replay("rbac", "no-token", token=None)


async def create_plain_lease(replayer: Replayer) -> None:
    """my-lease as the watch and kubectl transcripts had it: no labels."""
    create = exchange("watch", "watch-fieldselector-from-rv")["actions_during_watch"][0]
    status, _, _, _ = await replayer.send(
        {
            "method": "POST",
            "path": create["path"],
            "headers": {"Content-Type": "application/json"},
            "body": create["request_body"],
        }
    )
    assert status == 201


# -- watch streams -------------------------------------------------------------------------------


async def read_stream(response: aiohttp.ClientResponse) -> list[tuple[float, dict[str, Any]]]:
    started = time.monotonic()
    lines = []
    while True:
        line = await response.content.readline()
        if not line:
            return lines
        lines.append((time.monotonic() - started, json.loads(line)))


@pytest.mark.slow  # the recorded timeoutSeconds=5
async def test_a_field_selected_watch_reports_that_lease_only_and_ends_at_its_timeout(
    replayer: Replayer,
) -> None:
    """watch-fieldselector-from-rv: create, renew, no-op PUT (no event), stale PUT (409, no
    event), patch, another lease's update (not reported), delete, re-create; then a BOOKMARK
    shortly before timeoutSeconds, then a clean end."""
    recorded_watch = exchange("watch", "watch-fieldselector-from-rv")
    await replayer.replay("watch", "setup-create-other-lease")
    await replayer.replay("watch", "list-for-rv")
    request = recorded_watch["request"]
    url = replayer.base_url + replayer.rewrite_path(request["path"])
    async with replayer.session.get(url, headers={"Authorization": "Bearer x"}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
        assert response.headers.get("Transfer-Encoding") == "chunked"
        reader = asyncio.create_task(read_stream(response))
        for action in recorded_watch["actions_during_watch"]:
            status, _, body, _ = await replayer.send(
                {
                    "method": action["method"],
                    "path": action["path"],
                    "headers": {
                        "Content-Type": "application/merge-patch+json"
                        if action["method"] == "PATCH"
                        else "application/json"
                    },
                    "body": action.get("request_body"),
                }
            )
            assert status == action["status"], (action["what"], body)
            if isinstance(body, dict) and body.get("kind") == "Lease":
                replayer.learn_version(
                    action.get("response_resourceVersion"), body["metadata"]["resourceVersion"]
                )
                if action["method"] == "POST":
                    replayer.learn(
                        {"metadata": {"uid": _recorded_uid(recorded_watch, action)}}, body
                    )
        lines = await asyncio.wait_for(reader, timeout=10)
    expected = [line["parsed"] for line in recorded_watch["response"]["stream"]]
    assert [event["type"] for _, event in lines] == [event["type"] for event in expected]
    for (_, got), want in zip(lines, expected, strict=True):
        assert shape(got) == shape(want)
        if want["type"] != "BOOKMARK":
            assert got["object"]["spec"] == want["object"]["spec"]
            assert (
                got["object"]["metadata"]["resourceVersion"]
                == replayer.versions.get(want["object"]["metadata"]["resourceVersion"])
                or want["type"] == "DELETED"
            )
    # The bookmark comes late in the stream, before the timeout ends it.
    bookmark_at = lines[-1][0]
    assert 2.5 < bookmark_at < 5.0


def _recorded_uid(recorded_watch: dict[str, Any], action: dict[str, Any]) -> str:
    """The uid the real server gave the lease created by ``action`` (from its ADDED event)."""
    for line in recorded_watch["response"]["stream"]:
        obj = line["parsed"]["object"]
        if (
            line["parsed"]["type"] == "ADDED"
            and obj["metadata"].get("resourceVersion") == action["response_resourceVersion"]
        ):
            return str(obj["metadata"]["uid"])
    return ""


@pytest.mark.slow  # each stream runs to its recorded timeoutSeconds
@pytest.mark.parametrize(
    ("name", "expected_types", "other_writes"),
    [
        ("watch-no-rv", ["ADDED"], False),
        # Recorded: the cluster's revision moved on (247 -> 248) before the late bookmark.
        ("watch-rv-0", ["ADDED", "BOOKMARK", "BOOKMARK"], True),
        # Recorded: no progress, so no bookmark repeating the initial one.
        ("watch-no-rv-missing-object", ["BOOKMARK"], False),
        ("watch-send-initial-events-without-bookmarks", ["ADDED"], True),
    ],
)
async def test_initial_events_and_bookmarks_follow_the_recorded_streams(
    fake: FakeApiServer,
    replayer: Replayer,
    name: str,
    expected_types: list[str],
    other_writes: bool,
) -> None:
    await create_plain_lease(replayer)
    request = exchange("watch", name)["request"]
    url = replayer.base_url + request["path"]
    async with replayer.session.get(url, headers={"Authorization": "Bearer x"}) as response:
        assert response.status == 200
        reading = asyncio.create_task(read_stream(response))
        if other_writes:
            await asyncio.sleep(0.3)
            fake.cluster.bump()  # another object changes meanwhile
        lines = await asyncio.wait_for(reading, timeout=10)
    recorded_stream = [line["parsed"] for line in exchange("watch", name)["response"]["stream"]]
    assert [event["type"] for _, event in lines] == expected_types
    for (_, got), want in zip(lines, recorded_stream, strict=False):
        assert shape(got) == shape(want)
        annotations = want["object"]["metadata"].get("annotations")
        assert got["object"]["metadata"].get("annotations") == annotations


async def test_a_watch_from_a_compacted_resource_version_gets_a_410_error_event(
    fake: FakeApiServer, replayer: Replayer
) -> None:
    """HTTP 200, one ERROR event carrying a 410 Expired Status, then the stream ends."""
    await replayer.replay("leases", "create")
    recorded_too_old = exchange("watch", "watch-too-old-after-apiserver-restart")
    old_version = fake.cluster.rv
    await replayer.replay("leases", "get")
    fake.cluster.bump()
    floor = fake.cluster.compact()
    path = recorded_too_old["request"]["path"].replace(
        "resourceVersion=251", f"resourceVersion={old_version - 1}"
    )
    async with replayer.session.get(
        replayer.base_url + path, headers={"Authorization": "Bearer x"}
    ) as response:
        assert response.status == 200
        lines = await asyncio.wait_for(read_stream(response), timeout=5)
    want = recorded_too_old["response"]["stream"][0]["parsed"]
    assert len(lines) == 1
    got = lines[0][1]
    assert shape(got) == shape(want)
    assert got["object"] == {
        **want["object"],
        "message": f"too old resource version: {old_version - 1} ({floor})",
    }


@pytest.mark.parametrize(
    "name",
    [
        "watch-send-initial-events-without-rvmatch",
        "watch-send-initial-events-rvmatch-exact",
        "watch-bad-fieldselector",
        "watch-bad-rv-string",
    ],
)
async def test_bad_watch_requests_are_refused_with_the_recorded_status(
    replayer: Replayer, name: str
) -> None:
    recorded_exchange = exchange("watch", name)
    status, _, body, _ = await replayer.send(recorded_exchange["request"])
    assert status == recorded_exchange["response"]["status"]
    want = recorded_exchange["response"].get("body")
    if want is None:  # recorded as a one-line "stream"
        want = json.loads(recorded_exchange["response"]["stream"][0]["raw_line"])
    assert body == want


# -- kubectl's Table requests ----------------------------------------------------------------------


async def test_kubectl_table_requests_get_tables_of_the_recorded_shape(
    replayer: Replayer,
) -> None:
    """LIST and GET with the Table Accept header, with and without includeObject=Object."""
    await create_plain_lease(replayer)
    for name in ("replay-list-table", "replay-get-table", "replay-list-table-include-object"):
        recorded_exchange = exchange("kubectl", name)
        status, headers, body, _ = await replayer.send(recorded_exchange["request"])
        want = recorded_exchange["response"]["body"]
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert shape(body) == shape(want), name
        assert body["columnDefinitions"] == want["columnDefinitions"]
        assert body["rows"][0]["cells"][:2] == ["my-lease", "pod-a"]
        assert body["rows"][0]["cells"][2].endswith("s")


async def test_a_table_watch_sends_column_definitions_only_first(
    fake: FakeApiServer, replayer: Replayer
) -> None:
    await create_plain_lease(replayer)
    recorded_watch = exchange("kubectl", "replay-watch-table")
    path = (
        "/apis/coordination.k8s.io/v1/namespaces/demo/leases"
        f"?resourceVersion={fake.cluster.rv}&watch=true"
    )
    headers = {
        "Accept": recorded_watch["request"]["headers"]["Accept"],
        "Authorization": "Bearer x",
    }
    async with replayer.session.get(replayer.base_url + path, headers=headers) as response:
        await replayer.send(exchange("leases", "patch-merge")["request"])
        await replayer.send(exchange("leases", "delete")["request"])
        first = json.loads(await response.content.readline())
        second = json.loads(await response.content.readline())
    expected = [line["parsed"] for line in recorded_watch["response"]["stream"]]
    assert [first["type"], second["type"]] == ["MODIFIED", "DELETED"]
    assert shape(first) == shape(expected[0])
    assert first["object"]["columnDefinitions"] == expected[0]["object"]["columnDefinitions"]
    assert second["object"]["columnDefinitions"] is None
    assert shape(second["object"]["rows"]) == shape(expected[1]["object"]["rows"])
