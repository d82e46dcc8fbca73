"""The contract for many leases per sidecar (issue 11): one client, many leases, a successor
named on release, and the candidate registry — run against every registered store."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from sidecar.backends.base import Candidate, LeaseHeld, ListsOnBeat, NotOwned
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


async def test_a_hand_over_grants_the_successor_in_the_same_write(harness: StoreHarness) -> None:
    """One conditional write: the successor holds the lease with the next term (above the
    caller's floor too), the record names the candidate version it was chosen by, and the
    others see it on their watch like any grant."""
    a, b, c = harness.new_store(), harness.new_store(), harness.new_store()
    if not a.hands_over:
        pytest.skip(f"{a.description} does not hand over")
    granted = await take(a, "a_1")
    async with watching(c) as seen:
        await asyncio.wait_for(seen.get(), timeout=5.0)
        handed = await a.hand_over(
            "a_1", granted.term, successor="b_1", handed="4711", duration=LEASE, min_term=0
        )
        assert (handed.holder, handed.term, handed.handed) == ("b_1", granted.term + 1, "4711")
        assert not handed.released
        assert handed.successor is None
        while True:
            record = await asyncio.wait_for(seen.get(), timeout=1.0)
            if record is not None and record.holder == "b_1":
                assert (record.term, record.handed) == (granted.term + 1, "4711")
                break
    # The old holder's grant is gone: its renewal and release change nothing.
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, LEASE)
    with pytest.raises(NotOwned):
        await a.release("a_1", granted.term)
    # The successor renews its grant; the first renewal ends the hand-over.
    renewed = await b.renew("b_1", handed.term, LEASE)
    assert (renewed.holder, renewed.term, renewed.handed) == ("b_1", handed.term, None)
    read = await c.read()
    assert read is not None
    assert read.handed is None
    # Above the caller's floor, and the store's term is raised with it.
    again = await b.hand_over(
        "b_1", handed.term, successor="c_1", handed="4712", duration=LEASE, min_term=50
    )
    assert again.term == 51
    await c.read()  # (as its watch would have shown it)
    released = await c.release("c_1", again.term)
    assert released is not None
    taken = await take(a, "a_1")
    assert taken.term == 52


async def test_a_hand_over_by_anyone_but_the_holder_changes_nothing(
    harness: StoreHarness,
) -> None:
    a, b = harness.new_store(), harness.new_store()
    if not a.hands_over:
        pytest.skip(f"{a.description} does not hand over")
    granted = await take(a, "a_1")
    for identity, term in (("b_1", granted.term), ("a_1", granted.term - 1)):
        with pytest.raises(NotOwned) as refused:
            await b.hand_over(
                identity, term, successor="b_1", handed="1", duration=LEASE, min_term=0
            )
        assert refused.value.record is not None
        assert refused.value.record.holder == "a_1"
    read = await b.read()
    assert read is not None
    assert (read.holder, read.term, read.handed) == ("a_1", granted.term, None)
    # A released lease is no one's to hand over either.
    await a.release("a_1", granted.term)
    with pytest.raises(NotOwned):
        await a.hand_over(
            "a_1", granted.term, successor="b_1", handed="1", duration=LEASE, min_term=0
        )


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
        # Every watch connected (its first yield) before the write: the 2 s below is for the
        # notification only, not for subscribing a hundred channels on a busy machine.
        for name in names:
            await asyncio.wait_for(queues[name].get(), timeout=20.0)
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
    # A version the replica made is kept exactly as given: a hand-over names it back.
    await mine.beat(Candidate("a_1", "4611686018427387905", "rev-a", 3, True, started), LEASE)
    named = {c.identity: c for c in await theirs.list()}["a_1"]
    assert named.version == "4611686018427387905"
    # Another group is another registry.
    assert await other.candidates(f"{harness.lease_name}-elsewhere").list() == []
    await mine.leave("a_1")
    assert [c.identity for c in await theirs.list()] == ["b_1"]


async def test_a_beat_that_lists_writes_the_beat_and_answers_the_group_after_it(
    harness: StoreHarness,
) -> None:
    """`ListsOnBeat`: one request (ZooKeeper: one round trip) writes this replica's beat (a
    new version, seen by the others) and answers every record of the group as it is after
    that write — the first time creating the record, then over it."""
    one, other = harness.new_client(), harness.new_client()
    group = f"{harness.lease_name}-listed"
    mine = one.candidates(group)
    if not isinstance(mine, ListsOnBeat):
        pytest.skip(f"{one.description} beats and lists in two requests")
    await other.candidates(group).beat(Candidate("b_1", "7", "", 0, False, None), LEASE)
    listed = await mine.beat_and_list(Candidate("a_1", "11", "rev-a", 2, False, None), LEASE)
    assert {(c.identity, c.version, c.revision) for c in listed} == {
        ("a_1", "11", "rev-a"),
        ("b_1", "7", ""),
    }
    again = await mine.beat_and_list(Candidate("a_1", "12", "rev-a", 2, True, None), LEASE)
    assert {c.identity: (c.version, c.leaving) for c in again}["a_1"] == ("12", True)
    seen = {c.identity: c.version for c in await other.candidates(group).list()}
    assert seen == {"a_1": "12", "b_1": "7"}


async def test_a_follower_of_the_group_hears_each_join_leaving_mark_and_leave(
    harness: StoreHarness,
) -> None:
    """`changes` tells a join, a new leaving mark and a leave within moments, and `following`
    says when it is connected; a store that cannot follow (SQLite) ends at once and never
    says it follows, and the sidecar reads the group before each hand-over instead."""
    one, other = harness.new_client(), harness.new_client()
    group = f"{harness.lease_name}-followed"
    follower, writer = one.candidates(group), other.candidates(group)
    notices: asyncio.Queue[list[Candidate] | None] = asyncio.Queue()

    async def follow() -> None:
        async for notice in follower.changes():
            await notices.put(notice)

    task = asyncio.create_task(follow())
    try:
        first = asyncio.create_task(notices.get())
        done, _ = await asyncio.wait({first, task}, timeout=5.0, return_when="FIRST_COMPLETED")
        assert done, "neither a first notice nor the end of the stream"
        if task in done:
            first.cancel()
            assert task.exception() is None
            assert not follower.following()
            return
        deadline = time.monotonic() + 5.0
        while not follower.following():
            assert time.monotonic() < deadline, "a notice came, but never `following`"
            await asyncio.sleep(0.01)

        async def heard(check: object) -> None:
            """Notices until the records they point at pass ``check``."""
            while True:
                notice = await asyncio.wait_for(notices.get(), timeout=5.0)
                records = await follower.list() if notice is None else notice
                if check({c.identity: c for c in records}):  # type: ignore[operator]
                    return

        await writer.beat(Candidate("b_1", "", "rev-b", 0, False, None), LEASE)
        await heard(lambda seen: "b_1" in seen and not seen["b_1"].leaving)
        await writer.beat(Candidate("b_1", "", "rev-b", 0, True, None), LEASE)
        await heard(lambda seen: "b_1" in seen and seen["b_1"].leaving)
        await writer.leave("b_1")
        await heard(lambda seen: "b_1" not in seen)
        assert follower.following()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not follower.following()
