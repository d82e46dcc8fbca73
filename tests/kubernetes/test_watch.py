"""The store's watch on its one Lease: list, then watch from the list's resourceVersion;
resume after a dropped stream, list again after 410 Gone, ride out partitions and RBAC
refusals, and never raise."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from sidecar.backends.base import LeaseRecord
from sidecar.backends.kubernetes import KubernetesLeaseStore, KubernetesStoreClient
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.reflector import Pacing
from sidecar.supervisor import Supervisor
from tests.fakekube import FakeApiServer
from tests.fakekube.wire import LEASES
from tests.kubernetes.conftest import LEASE, NAMESPACE, StoreFactory

Seen = list[LeaseRecord | None]


@contextlib.asynccontextmanager
async def watching(store: KubernetesLeaseStore) -> AsyncIterator[Seen]:
    seen: Seen = []
    failure: list[BaseException] = []

    async def follow() -> None:
        try:
            async for record in store.watch():
                seen.append(record)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the watch must never raise
            failure.append(exc)
            raise

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not failure, failure


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> float:
    """Seconds it took for ``predicate`` to hold; fails after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "condition not met in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def watch_requests(fake: FakeApiServer) -> list[dict[str, object]]:
    return [r for r in fake.requests if r["resource"] == "leases" and r["verb"] == "watch"]


def list_requests(fake: FakeApiServer) -> list[dict[str, object]]:
    return [r for r in fake.requests if r["resource"] == "leases" and r["verb"] == "list"]


async def test_the_watch_lists_first_and_then_reports_every_change(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    holder = make_store()
    async with watching(make_store()) as seen:
        await until(lambda: len(seen) == 1)
        assert seen == [None]  # listed: no Lease yet
        granted = await holder.try_acquire("a_1", 2, 0, expected=None)
        await until(lambda: len(seen) == 2)
        await holder.renew("a_1", granted.term, 2)
        await until(lambda: len(seen) == 3)
        await holder.release("a_1", granted.term)
        await until(lambda: len(seen) == 4)
        fake.cluster.delete(LEASES, NAMESPACE, LEASE)
        await until(lambda: len(seen) == 5)
    holders = [(r.holder, r.term, r.released) if r else None for r in seen]
    # Deleted: no record at all (a store that lost state, not a free lease at its last term;
    # the followers wait it out, rule 8).
    assert holders == [None, ("a_1", 1, False), ("a_1", 1, False), (None, 1, True), None]
    versions = [r.version for r in seen[1:4] if r is not None]
    assert len(set(versions)) == 3  # every write, the renewal included, is a new version
    assert len(list_requests(fake)) == 1
    assert len(watch_requests(fake)) == 1
    query = str(watch_requests(fake)[0]["query"])
    assert "fieldSelector=metadata.name%3Dmy-app" in query
    assert "allowWatchBookmarks=true" in query


async def test_a_broken_watch_lists_again_and_reports_what_is_there(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    """A reset watch connection may mean a restarted API server whose storage was wiped: a
    resume from a resourceVersion it no longer knows could be silent, so the store lists
    again, and the elector sees the current state (a loss, if it is gone)."""
    holder = make_store()
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    async with watching(make_store()) as seen:
        await until(lambda: len(seen) == 1 and len(watch_requests(fake)) == 1)
        assert fake.drop_watches() == 1
        await until(lambda: len(list_requests(fake)) == 2 and len(seen) == 2)
        assert seen[-1] is not None
        assert (seen[-1].holder, seen[-1].term) == ("a_1", granted.term)
        await until(lambda: len(watch_requests(fake)) == 2)
        await holder.release("a_1", granted.term)
        took = await until(lambda: any(r is not None and r.free for r in seen))
        assert took < 1.0


async def test_a_watch_too_old_to_resume_lists_again(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    holder = make_store()
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    async with watching(make_store()) as seen:
        await until(lambda: len(seen) == 1 and len(watch_requests(fake)) == 1)
        fake.cluster.bump()
        fake.cluster.compact()  # the history the watch would resume from is gone
        fake.drop_watches()
        await until(lambda: len(list_requests(fake)) == 2)
        await holder.release("a_1", granted.term)
        await until(lambda: any(r is not None and r.free for r in seen))
    assert len(seen) >= 3  # the first list, the second list, the release


async def test_the_watch_outlives_a_partition_without_raising(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    holder = make_store()
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    async with watching(make_store()) as seen:
        await until(lambda: len(seen) == 1 and len(watch_requests(fake)) == 1)
        await fake.partition()
        await asyncio.sleep(0.5)
        await fake.heal()
        await until(lambda: len(watch_requests(fake)) >= 2, timeout=5)
        await holder.release("a_1", granted.term)
        await until(lambda: any(r is not None and r.free for r in seen))


async def test_the_watch_keeps_trying_while_rbac_refuses_it(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    """(Backing off faster than client-go's 0.8 s to 30 s, which test_reflector.py checks.)"""
    fake.faults = fake.faults.parse({"forbid": [{"verbs": ["list", "watch"]}]})
    holder = make_store()
    async with watching(make_store(pacing=Pacing(initial=0.05, cap=0.2))) as seen:
        await until(lambda: len(list_requests(fake)) >= 3)  # refused, backing off, retrying
        assert seen == []
        fake.faults = fake.faults.parse({})
        await holder.try_acquire("a_1", 2, 0, expected=None)
        await until(lambda: any(r is not None and r.holder == "a_1" for r in seen))


async def test_the_watch_starts_again_when_the_server_ends_it(
    make_store: StoreFactory, fake: FakeApiServer
) -> None:
    """timeoutSeconds runs out: a clean end, a new watch from the last resourceVersion."""
    holder = make_store()
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    async with watching(make_store(watch_timeout=1.0)) as seen:
        await until(lambda: len(watch_requests(fake)) >= 2, timeout=4)
        await holder.renew("a_1", granted.term, 2)
        await until(lambda: len(seen) >= 2)
    assert len(list_requests(fake)) == 1


async def test_a_shared_watch_that_fails_comes_back_under_its_supervisor(
    kubeconfig: Path,
) -> None:
    """The shared namespace watch rides out what the API server does; a failure of its own (a
    bug, here in applying an event) ends the task, and the supervisor starts it again: it lists
    and reports what is there (issue 25)."""
    supervisor = Supervisor(backoff=(0.05, 0.05))
    client = KubernetesStoreClient(
        NAMESPACE,
        api=KubeApi(str(kubeconfig), 2.0),
        group=LEASE,
        shared_watch=True,
        default_duration=2.0,
        supervisor=supervisor,
    )
    holder = client.lease(LEASE)  # (its writes carry the label the shared watch selects)
    try:
        async with watching(client.lease(LEASE)) as seen:
            await until(lambda: len(seen) >= 1)
            shared = client._shared
            assert shared is not None

            def apply_fails(kind: str, lease: dict[str, object]) -> None:
                raise ValueError("an event it cannot apply")

            shared._apply = apply_fails  # type: ignore[method-assign]
            await holder.try_acquire("a_1", 2, 0, expected=None)
            await until(lambda: supervisor.failures.get("kubernetes-leases-watch") == 1)
            del shared._apply  # the class's own again
            await until(lambda: any(r is not None and r.holder == "a_1" for r in seen))
            assert supervisor.down() == {}
    finally:
        await client.close()
