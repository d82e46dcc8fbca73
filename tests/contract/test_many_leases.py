"""The contract for many leases per sidecar (issue 11): one client, many leases, a successor
named on release, and the candidate registry — run against every registered store."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from sidecar.backends.base import Candidate, LeaseHeld
from tests.contract.harness import StoreHarness
from tests.contract.test_contract import LEASE, take, watching


async def test_a_release_can_name_a_successor_and_is_still_free_for_anyone(
    harness: StoreHarness,
) -> None:
    a, b, c = harness.new_store(), harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    async with watching(b) as seen:
        await asyncio.wait_for(seen.get(), timeout=5.0)
        released = await a.release("a_1", granted.term, successor="b_1")
        assert released is not None
        assert released.free
        assert released.successor == "b_1"
        assert released.term == granted.term
        while True:  # the watch carries the successor to the others
            record = await asyncio.wait_for(seen.get(), timeout=1.0)
            if record is not None and record.free:
                assert record.successor == "b_1"
                break
    # A preference only: the record is free, so someone else may take it too.
    taken = await c.try_acquire("c_1", LEASE, 0, expected=released.version)
    assert taken.holder == "c_1"
    assert taken.term == granted.term + 1
    assert taken.successor is None  # a grant clears the hand-over


async def test_a_plain_release_names_no_successor(harness: StoreHarness) -> None:
    a = harness.new_store()
    granted = await take(a, "a_1")
    released = await a.release("a_1", granted.term)
    assert released is not None
    assert released.free
    assert released.successor is None


async def test_leases_of_one_client_are_independent(harness: StoreHarness) -> None:
    """Ten leases on one connection: each its own holder, term and versions."""
    one, other = harness.new_client(), harness.new_client()
    names = [f"{harness.lease_name}-{i}" for i in range(10)]
    grants = [await take(one.lease(name), f"a_{i}") for i, name in enumerate(names)]
    assert [g.holder for g in grants] == [f"a_{i}" for i in range(10)]
    for name, grant in zip(names, grants, strict=True):
        seen = await other.lease(name).read()
        assert seen is not None
        assert seen.holder == grant.holder
        assert seen.term == grant.term
    # Releasing one frees only that one.
    await one.lease(names[3]).release("a_3", grants[3].term)
    records = [await other.lease(name).read() for name in names]
    assert [r is not None and r.free for r in records] == [i == 3 for i in range(10)]
    try:
        await other.lease(names[4]).try_acquire("b_1", LEASE, 0, expected=records[3].version)
    except LeaseHeld:
        pass
    else:
        raise AssertionError("one lease's version granted another lease")


async def test_one_client_watches_a_hundred_leases_and_each_watch_sees_only_its_own(
    harness: StoreHarness,
) -> None:
    writer, reader = harness.new_client(), harness.new_client()
    names = [f"{harness.lease_name}-w{i}" for i in range(100)]
    queues = {}
    contexts = []
    for name in names:
        context = watching(reader.lease(name))
        contexts.append(context)
        queues[name] = await context.__aenter__()
    try:
        target = names[57]
        granted = await take(writer.lease(target), "a_1")
        deadline = time.monotonic() + 2.0
        while True:
            record = await asyncio.wait_for(
                queues[target].get(), timeout=max(0.01, deadline - time.monotonic())
            )
            if record is not None and record.version == granted.version:
                break
        for name in names:
            while not queues[name].empty():
                record = queues[name].get_nowait()
                if name != target:
                    assert record is None or record.holder != "a_1", name
    finally:
        for context in contexts:
            await context.__aexit__(None, None, None)


async def test_candidates_beat_list_and_leave(harness: StoreHarness) -> None:
    one, other = harness.new_client(), harness.new_client()
    group = f"{harness.lease_name}-group"
    started = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    mine = one.candidates(group)
    theirs = other.candidates(group)
    await mine.beat(Candidate("a_1", "", "rev-a", 3, False, started), LEASE)
    await theirs.beat(Candidate("b_1", "", "", 0, False, None), LEASE)
    listed = {c.identity: c for c in await theirs.list()}
    assert set(listed) == {"a_1", "b_1"}
    a = listed["a_1"]
    assert (a.revision, a.priority, a.leaving, a.started_at) == ("rev-a", 3, False, started)
    assert a.version
    assert a.beat_at is not None
    # Every beat is a new version (liveness is observed from versions, rule 2).
    await mine.beat(Candidate("a_1", "", "rev-a", 3, True, started), LEASE)
    again = {c.identity: c for c in await theirs.list()}["a_1"]
    assert again.version != a.version
    assert again.leaving
    # Another group is another registry.
    assert await other.candidates(f"{harness.lease_name}-elsewhere").list() == []
    await mine.leave("a_1")
    assert [c.identity for c in await theirs.list()] == ["b_1"]
