"""Many leases on one client (issue 11), counted at the fake API server: one watch stream for
a hundred leases, the successor and group label on the Lease objects, the candidates Lease."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sidecar.backends.base import Candidate, LeaseRecord
from sidecar.backends.kubernetes import KubernetesLeaseStore, KubernetesStoreClient
from sidecar.backends.kubernetes.candidates import annotation_key
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.store import GROUP_LABEL, SUCCESSOR_ANNOTATION
from sidecar.candidates import CandidateBeat, CandidateView
from tests.fakekube import FakeApiServer
from tests.fakekube.wire import LEASES
from tests.kubernetes.conftest import LEASE, NAMESPACE, StoreFactory
from tests.kubernetes.test_watch import list_requests, until, watch_requests

ClientFactory = Callable[..., KubernetesStoreClient]


@pytest.fixture
async def make_client(kubeconfig: Path) -> AsyncIterator[ClientFactory]:
    clients: list[KubernetesStoreClient] = []

    def make(*, shared_watch: bool = True) -> KubernetesStoreClient:
        client = KubernetesStoreClient(
            NAMESPACE,
            api=KubeApi(str(kubeconfig), 5.0),
            group=LEASE,
            shared_watch=shared_watch,
            default_duration=2.0,
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def follow(store: KubernetesLeaseStore, seen: list[LeaseRecord | None]) -> None:
    async for record in store.watch():
        seen.append(record)


async def test_a_hundred_and_twenty_leases_on_one_client_share_one_watch_stream(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    writer, reader = make_client(), make_client()
    names = [f"{LEASE}-{i}" for i in range(120)]
    seen: dict[str, list[LeaseRecord | None]] = {name: [] for name in names}
    tasks = [asyncio.create_task(follow(reader.lease(name), seen[name])) for name in names]
    try:
        await until(lambda: all(len(records) == 1 for records in seen.values()))
        granted = await writer.lease(names[7]).try_acquire("a_1", 2, 0, expected=None)
        await until(lambda: len(seen[names[7]]) == 2)
        assert seen[names[7]][-1] == granted
        assert all(len(seen[name]) == 1 for name in names if name != names[7])
        assert len(watch_requests(fake)) == 1
        assert len(list_requests(fake)) == 1
        query = urllib.parse.parse_qs(str(watch_requests(fake)[0]["query"]))
        assert query["labelSelector"] == [f"{GROUP_LABEL}={LEASE}"]
        assert "fieldSelector" not in query
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_dropped_shared_watch_lists_again_and_every_lease_hears_of_it(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    """Each lease's watch yields once after every (re)connection, as its own watch would."""
    client = make_client()
    names = [f"{LEASE}-{i}" for i in range(20)]
    seen: dict[str, list[LeaseRecord | None]] = {name: [] for name in names}
    held = await make_client().lease(names[3]).try_acquire("a_1", 2, 0, expected=None)
    tasks = [asyncio.create_task(follow(client.lease(name), seen[name])) for name in names]
    try:
        await until(lambda: all(len(records) == 1 for records in seen.values()))
        await until(lambda: len(watch_requests(fake)) == 1)
        assert fake.drop_watches() == 1
        await until(lambda: all(len(records) == 2 for records in seen.values()))
        assert seen[names[3]][-1] == held
        assert all(seen[name] == [None, None] for name in names if name != names[3])
        assert len(list_requests(fake)) == 2
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_client_with_few_leases_watches_each_by_name(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    client = make_client(shared_watch=False)
    seen: list[LeaseRecord | None] = []
    tasks = [asyncio.create_task(follow(client.lease(f"{LEASE}-{i}"), seen)) for i in range(3)]
    try:
        await until(lambda: len(seen) == 3 and len(watch_requests(fake)) == 3)
        queries = sorted(str(request["query"]) for request in watch_requests(fake))
        assert all("fieldSelector=metadata.name%3Dmy-app-" in query for query in queries)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_successor_is_an_annotation_of_the_released_lease_and_a_grant_drops_it(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    a, b = make_client().lease(LEASE), make_client().lease(LEASE)
    granted = await a.try_acquire("a_1", 2, 0, expected=None)
    released = await a.release("a_1", granted.term, successor="b_1")
    assert released is not None
    assert released.successor == "b_1"
    stored = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    assert stored is not None
    assert stored["metadata"]["annotations"] == {SUCCESSOR_ANNOTATION: "b_1"}
    assert stored["spec"]["holderIdentity"] == ""
    assert (await b.read()) == released
    taken = await b.try_acquire("b_1", 2, 0, expected=released.version)
    assert taken.successor is None
    stored = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    assert stored is not None
    assert SUCCESSOR_ANNOTATION not in stored["metadata"].get("annotations", {})


async def test_a_lease_written_without_the_group_label_gets_it_from_the_clients_first_write(
    make_client: ClientFactory, make_store: StoreFactory, fake: FakeApiServer
) -> None:
    old = make_store()  # a single-lease store, as an older sidecar: no label
    granted = await old.try_acquire("a_1", 2, 0, expected=None)
    stored = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    assert stored is not None
    assert "labels" not in stored["metadata"]
    released = await old.release("a_1", granted.term)
    assert released is not None
    await make_client().lease(LEASE).try_acquire("b_1", 2, 0, expected=released.version)
    stored = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    assert stored is not None
    assert stored["metadata"]["labels"] == {GROUP_LABEL: LEASE}


async def test_candidates_live_in_one_lease_one_annotation_each(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    one, other = make_client().candidates(LEASE), make_client().candidates(LEASE)
    await asyncio.gather(
        one.beat(Candidate("a_1", ""), 2.0), other.beat(Candidate("b_1", ""), 2.0)
    )  # both may find no Lease: one creates it, the other's create is a 409, then a patch
    stored = fake.cluster.get(LEASES, NAMESPACE, f"{LEASE}-candidates")
    assert stored is not None
    keys = set(stored["metadata"]["annotations"])
    assert keys == {annotation_key("a_1"), annotation_key("b_1")}
    assert "labels" not in stored["metadata"]  # not a lease: the shared watch must skip it
    await one.leave("a_1")  # a merge patch with null: the key goes, the other stays
    stored = fake.cluster.get(LEASES, NAMESPACE, f"{LEASE}-candidates")
    assert stored is not None
    assert set(stored["metadata"]["annotations"]) == {annotation_key("b_1")}
    assert [c.identity for c in await one.list()] == ["b_1"]


async def test_candidates_not_beaten_for_twenty_leases_are_collected(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    registry = make_client().candidates(LEASE)
    await registry.beat(Candidate("b_1", ""), 2.0)
    # b_1 beat an hour ago (by the wall clock, which only garbage collection reads).
    stored = fake.cluster.get(LEASES, NAMESPACE, f"{LEASE}-candidates")
    assert stored is not None
    key = annotation_key("b_1")
    value = json.loads(stored["metadata"]["annotations"][key])
    value["beat"] = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    stored["metadata"]["annotations"][key] = json.dumps(value)
    fake.cluster.store(LEASES, NAMESPACE, f"{LEASE}-candidates", stored)
    await make_client().candidates(LEASE).beat(Candidate("a_1", ""), 2.0)
    assert [c.identity for c in await registry.list()] == ["a_1"]


async def test_a_beat_following_the_candidates_lease_reads_nothing_the_watch_brought(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    """The candidates Lease's watch brings every record at every beat, so a replica that
    needs the group (a leader, or every replica with several leases) neither reads it on its
    beats nor before a hand-over while the watch runs: the view is current from the stream."""
    me = Candidate("a_1", "", started_at=datetime(2026, 12, 1, tzinfo=UTC))
    heard = 0

    def on_change() -> None:
        nonlocal heard
        heard += 1

    beat = CandidateBeat(
        make_client().candidates(LEASE), CandidateView(me, 6.0), 2.0, 1.0, 2.0, on_change=on_change
    )
    other = make_client().candidates(LEASE)
    await other.beat(Candidate("b_1", ""), 2.0)
    assert await beat.once()  # its first beat also collects garbage, with a read of its own
    following = asyncio.create_task(beat.follow())
    try:
        await until(beat.current)
        await other.beat(Candidate("b_1", "", leaving=True), 2.0)

        def reads() -> int:
            return len(
                [
                    r
                    for r in fake.requests
                    if r["verb"] == "get" and r["name"] == f"{LEASE}-candidates"
                ]
            )

        before, told = reads(), heard
        for _ in range(3):
            assert await beat.once()
        # Each beat still tells the sidecar, as a read would (the balancer waits for it).
        assert heard >= told + 3
        await until(lambda: any(c.leaving for c in beat.view.all()))
        assert beat.current()
        assert reads() == before
        assert {c.identity for c in beat.view.all()} == {"a_1", "b_1"}
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    assert not beat.current()
    assert await beat.once()
    assert reads() == before + 1  # not following: the beat reads the group again


async def test_candidate_annotations_nobody_can_read_are_left_out_and_the_beat_goes_on(
    make_client: ClientFactory, fake: FakeApiServer
) -> None:
    """Issue 25: an annotation that is not JSON, one with ``priority: "abc"``, and one whose
    identity is not the one its key was made from (a copy under another replica's key):
    each reads as a record that cannot be read; the real ones are as they were."""
    registry = make_client().candidates(LEASE)
    await registry.beat(Candidate("a_1", "11"), 2.0)
    stored = fake.cluster.get(LEASES, NAMESPACE, f"{LEASE}-candidates")
    assert stored is not None
    annotations = stored["metadata"]["annotations"]
    mine = json.loads(annotations[annotation_key("a_1")])
    annotations[annotation_key("x_1")] = "{not json"
    annotations[annotation_key("y_1")] = json.dumps({**mine, "identity": "y_1", "priority": "abc"})
    annotations[annotation_key("z_1")] = json.dumps({**mine, "identity": "a_1", "version": "9"})
    fake.cluster.store(LEASES, NAMESPACE, f"{LEASE}-candidates", stored)
    found = await registry.list()
    assert sorted(c.identity for c in found if c.unreadable is None) == ["a_1"]
    problems = sorted(c.unreadable or "" for c in found if c.unreadable is not None)
    assert len(problems) == 3
    assert any("priority" in p for p in problems)
    assert any("another identity's key" in p for p in problems)
    await registry.beat(Candidate("a_1", "12"), 2.0)  # the beat goes on
    assert [c.version for c in await registry.list() if c.identity == "a_1"] == ["12"]
