"""The lease store contract (sidecar/backends/base.py), run against every registered store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from sidecar.backends.base import (
    HOLD_HOLDER,
    Conflict,
    FollowsByCall,
    LeaseHeld,
    LeaseRecord,
    LeaseStore,
    NotOwned,
    StoreError,
)
from tests.contract.harness import StoreHarness

LEASE = 30.0


async def take(
    store: LeaseStore, identity: str, min_term: int = 0, duration: float = LEASE
) -> LeaseRecord:
    """Acquire naming exactly what the store holds now (as a candidate that has watched it
    expire, or seen it released, would)."""
    current = await store.read()
    return await store.try_acquire(
        identity, duration, min_term, expected=current.version if current else None
    )


@contextlib.asynccontextmanager
async def watching(
    store: LeaseStore, *, calls: bool = False
) -> AsyncIterator[asyncio.Queue[LeaseRecord | None]]:
    """What ``store.watch()`` yields, in a queue, while the block runs; ``calls``: what
    ``store.follow`` calls it with instead (`FollowsByCall`, the elector's way where offered)."""
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
    if calls:
        if not isinstance(store, FollowsByCall):
            pytest.skip(f"{store.description} is followed through watch() only")
        stop = store.follow(seen.put_nowait)
        try:
            yield seen
        finally:
            stop()
        return

    async def follow() -> None:
        async for record in store.watch():
            await seen.put(record)

    watcher = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def acquire_or_none(store: LeaseStore, identity: str) -> LeaseRecord | None:
    try:
        return await store.try_acquire(identity, LEASE, 0, expected=None)
    except (LeaseHeld, Conflict):
        return None


async def test_fifty_concurrent_acquirers_produce_exactly_one_winner(harness: StoreHarness) -> None:
    """Exactly one of 50 simultaneous candidates is granted the lease."""
    stores = [harness.new_store() for _ in range(50)]
    results = await asyncio.gather(
        *(acquire_or_none(store, f"candidate-{i}_x") for i, store in enumerate(stores))
    )
    winners = [record for record in results if record is not None]
    assert len(winners) == 1
    current = await harness.new_store().read()
    assert current is not None
    assert current.holder == winners[0].holder
    assert current.term == winners[0].term == 1


async def test_a_candidate_naming_an_old_version_is_refused_and_told_what_is_there(
    harness: StoreHarness,
) -> None:
    """The store grants only over exactly the version the caller names; otherwise LeaseHeld
    with the current record, and nothing changes (rules 1 and 2)."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    renewed = await a.renew("a_1", granted.term, LEASE)
    for stale in (None, granted.version):
        with pytest.raises((LeaseHeld, Conflict)) as held:
            await b.try_acquire("b_1", LEASE, 0, expected=stale)
        assert held.value.record is not None
        assert held.value.record.holder == "a_1"
    after = await b.read()
    assert after is not None
    assert (after.holder, after.term, after.version) == ("a_1", granted.term, renewed.version)


async def test_a_version_the_store_has_since_lost_grants_nothing(harness: StoreHarness) -> None:
    """A candidate that watched a version expire, while the store lost it (a restart, a
    deletion) before it asked, is refused: naming a version must never re-create the record
    (a Kubernetes PUT to a missing Lease would create it, but not with the old uid)."""
    a, b = harness.new_store(), harness.new_store()
    await take(a, "a_1")
    watched = await b.read()
    assert watched is not None
    await harness.reset()
    with pytest.raises((LeaseHeld, Conflict)):
        await b.try_acquire("b_1", LEASE, watched.term, expected=watched.version)
    assert await a.read() is None, "the refused grant wrote something"


async def test_a_version_watched_unchanged_is_taken_with_the_next_term(
    harness: StoreHarness,
) -> None:
    """Naming the holder's current version (which a follower has watched unchanged for a
    lease) grants the next term; the old holder can no longer renew."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    taken = await take(b, "b_1")
    assert (taken.holder, taken.term) == ("b_1", granted.term + 1)
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, LEASE)


async def test_renew_by_a_non_owner_changes_nothing_and_says_so(harness: StoreHarness) -> None:
    """Renewing someone else's lease raises NotOwned and leaves the record as it was."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    with pytest.raises(NotOwned) as refused:
        await b.renew("b_1", granted.term, LEASE)
    assert refused.value.record is not None
    assert refused.value.record.holder == "a_1"
    after = await b.read()
    assert after is not None
    assert (after.holder, after.term, after.version) == ("a_1", granted.term, granted.version)


async def test_renew_with_a_stale_term_changes_nothing(harness: StoreHarness) -> None:
    """The holder's identity alone is not enough: the term must match too."""
    a = harness.new_store()
    granted = await take(a, "a_1")
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term - 1, LEASE)
    after = await a.read()
    assert after is not None
    assert after.version == granted.version


async def test_release_by_a_non_owner_changes_nothing_and_says_so(harness: StoreHarness) -> None:
    """Releasing someone else's lease raises NotOwned; the holder keeps it."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    with pytest.raises(NotOwned):
        await b.release("b_1", granted.term)
    after = await b.read()
    assert after is not None
    assert (after.holder, after.term) == ("a_1", granted.term)
    assert not after.free
    assert not after.released


async def test_the_owner_renews_and_keeps_its_term(harness: StoreHarness) -> None:
    """A renewal extends the grant without a new term; the version changes."""
    a = harness.new_store()
    granted = await take(a, "a_1")
    renewed = await a.renew("a_1", granted.term, LEASE)
    assert renewed.holder == "a_1"
    assert renewed.term == granted.term
    assert renewed.version != granted.version


async def test_versions_are_never_reused(harness: StoreHarness) -> None:
    """Every write has a version no earlier write had, also after the record was deleted and
    written again: "the same version" must mean "nothing was written in between"."""
    a = harness.new_store()
    seen = []
    for _ in range(3):
        granted = await take(a, "a_1")
        seen.append(granted.version)
        renewed = await a.renew("a_1", granted.term, LEASE)
        seen.append(renewed.version)
        await harness.reset()
    assert len(set(seen)) == len(seen)


async def test_a_release_lets_another_acquire_at_once(harness: StoreHarness) -> None:
    """Released means free now, with the term kept, not free after the lease runs out."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    released = await a.release("a_1", granted.term)
    assert released is not None
    assert (released.holder, released.term, released.released) == (None, granted.term, True)
    assert released.free
    read = await b.read()
    assert read is not None
    assert read.free
    taken = await b.try_acquire("b_1", LEASE, 0, expected=read.version)
    assert taken.holder == "b_1"
    assert taken.term == granted.term + 1


async def test_the_term_grows_with_every_grant(harness: StoreHarness) -> None:
    """Acquire, release, acquire again by anyone: each grant has a higher term."""
    stores = [harness.new_store() for _ in range(3)]
    terms = []
    for round_ in range(6):
        store = stores[round_ % 3]
        identity = f"r{round_ % 3}_1"
        granted = await take(store, identity)
        terms.append(granted.term)
        await store.release(identity, granted.term)
    assert terms == sorted(terms)
    assert len(set(terms)) == len(terms)


async def test_the_holder_acquiring_again_gets_a_new_term(harness: StoreHarness) -> None:
    """Re-acquiring one's own lease is a new grant: a new fencing token."""
    a = harness.new_store()
    first = await take(a, "a_1")
    again = await take(a, "a_1")
    assert again.holder == "a_1"
    assert again.term == first.term + 1


async def test_after_a_reset_a_grant_is_above_the_callers_floor(
    harness: StoreHarness,
) -> None:
    """A reset store forgot its term: the caller's floor (every term it has seen, plus the jump
    after a loss) decides the next term, so it never goes back (rule 5)."""
    a, b = harness.new_store(), harness.new_store()
    granted = None
    for _ in range(3):
        granted = await take(a, "a_1")
        await a.release("a_1", granted.term)
    assert granted is not None
    await harness.reset()
    assert await b.read() is None
    taken = await b.try_acquire("b_1", LEASE, granted.term + 1000, expected=None)
    assert taken.holder == "b_1"
    assert taken.term == granted.term + 1001


async def test_a_holder_the_store_forgot_puts_its_grant_back(harness: StoreHarness) -> None:
    """Renewing a grant the store lost (reset) writes it back with the same holder and term,
    and the store's own term follows: the next grant is above it."""
    a, b = harness.new_store(), harness.new_store()
    for _ in range(2):
        first = await take(a, "a_1")
        await a.release("a_1", first.term)
    granted = await take(a, "a_1")
    await harness.reset()
    restored = await a.renew("a_1", granted.term, LEASE)
    assert (restored.holder, restored.term) == ("a_1", granted.term)
    current = await b.read()
    assert current is not None
    assert (current.holder, current.term) == ("a_1", granted.term)
    await a.release("a_1", granted.term)
    taken = await take(b, "b_1")
    assert taken.term == granted.term + 1


async def test_a_loss_marker_goes_only_where_the_store_holds_nothing_or_a_lower_term(
    harness: StoreHarness,
) -> None:
    """``mark_lost`` writes a record with no holder, not released, at the term the follower
    saw — on an empty store, or over a lower marker — and never over a record of its term or
    above."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    assert await b.mark_lost(granted.term, LEASE) == await b.read()  # not below: untouched
    current = await b.read()
    assert current is not None
    assert current.holder == "a_1"
    await harness.reset()
    marker = await b.mark_lost(7, LEASE)
    assert marker is not None
    assert (marker.holder, marker.term, marker.released, marker.forgotten) == (None, 7, False, True)
    assert not marker.free
    assert await a.read() == marker
    lower = await a.mark_lost(5, LEASE)
    assert lower is not None
    assert (lower.term, lower.version) == (7, marker.version)
    higher = await a.mark_lost(9, LEASE)
    assert higher is not None
    assert (higher.term, higher.forgotten) == (9, True)
    assert higher.version != marker.version
    with pytest.raises(NotOwned):
        await a.release("a_1", granted.term)


async def test_a_loss_marker_goes_over_a_grant_below_its_term(harness: StoreHarness) -> None:
    """A grant below the term a follower saw is a count that started again after a loss: its
    holder's token is one a fence has already seen. The marker replaces it; the holder's next
    renewal is refused, and the next grant is above the marker's term."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    marker = await b.mark_lost(granted.term + 5, LEASE)
    assert marker is not None
    assert (marker.holder, marker.term, marker.forgotten) == (None, granted.term + 5, True)
    assert (marker.released, marker.successor, marker.free) == (False, None, False)
    assert await a.read() == marker
    with pytest.raises((NotOwned, Conflict)):
        await a.renew("a_1", granted.term, LEASE)
    taken = await a.try_acquire("b_1", LEASE, 0, expected=marker.version)
    assert taken.term > granted.term + 5


async def test_a_loss_marker_never_goes_over_an_operators_hold(harness: StoreHarness) -> None:
    """A hold leads nothing (its term fences nothing) and must stay until it is lifted."""
    a, b = harness.new_store(), harness.new_store()
    for holder in (HOLD_HOLDER, f"{HOLD_HOLDER} by alice"):
        current = await a.read()
        held = await a.try_acquire(holder, LEASE, 0, expected=current.version if current else None)
        assert await b.mark_lost(held.term + 5, LEASE) == held
        assert await a.read() == held
        await a.release(holder, held.term)


async def test_a_loss_marker_goes_over_a_release_below_its_term(harness: StoreHarness) -> None:
    """A release below the term a follower saw is a count that started again after a loss:
    the marker replaces it (its successor too), so the next grant is above the marker's term.
    A release at or above the term stays free."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    released = await a.release("a_1", granted.term, successor="b_1")
    assert released is not None
    assert released.free
    assert await b.mark_lost(granted.term, LEASE) == released  # not below: untouched
    marker = await b.mark_lost(granted.term + 5, LEASE)
    assert marker is not None
    assert (marker.holder, marker.term, marker.forgotten) == (None, granted.term + 5, True)
    assert (marker.released, marker.successor, marker.free) == (False, None, False)
    assert await a.read() == marker
    with pytest.raises((LeaseHeld, Conflict)):
        await a.try_acquire("a_2", LEASE, 0, expected=released.version)
    taken = await a.try_acquire("a_2", LEASE, 0, expected=marker.version)
    assert taken.term > granted.term + 5


async def test_a_grant_over_a_loss_marker_is_above_its_term(harness: StoreHarness) -> None:
    """The marker is waited out like any record, then taken naming its version: the new term
    is above the marker's."""
    a, b = harness.new_store(), harness.new_store()
    await take(a, "a_1")
    await harness.reset()
    marker = await b.mark_lost(40, LEASE)
    assert marker is not None
    with pytest.raises((LeaseHeld, Conflict)):
        await a.try_acquire("a_2", LEASE, 0, expected=None)  # "nothing stored" is stale
    taken = await a.try_acquire("a_2", LEASE, 0, expected=marker.version)
    assert (taken.holder, taken.term) == ("a_2", 41)


async def test_a_holder_puts_its_grant_back_over_a_marker_of_its_term(
    harness: StoreHarness,
) -> None:
    """A follower that saw the loss wrote the holder's own term down: the holder's renewal
    still puts its grant back. A marker above its term is a grant it never saw: not ours."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    await harness.reset()
    await b.mark_lost(granted.term, LEASE)
    restored = await a.renew("a_1", granted.term, LEASE)
    assert (restored.holder, restored.term) == ("a_1", granted.term)
    # The holder saw the store empty first (its put-back then creates the record, and finds
    # the marker there already).
    await harness.reset()
    assert await a.read() is None
    await b.mark_lost(granted.term, LEASE)
    restored = await a.renew("a_1", granted.term, LEASE)
    assert (restored.holder, restored.term) == ("a_1", granted.term)
    await harness.reset()
    await b.mark_lost(granted.term + 1, LEASE)
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, LEASE)


@pytest.mark.parametrize("calls", [False, True], ids=["watch", "follow"])
async def test_the_watch_reports_a_loss_marker(harness: StoreHarness, calls: bool) -> None:
    """Followers (and a holder the store forgot) learn of a marker from the watch."""
    a, b = harness.new_store(), harness.new_store()
    await take(a, "a_1")
    await harness.reset()
    async with watching(b, calls=calls) as seen:
        await asyncio.wait_for(seen.get(), timeout=5.0)  # connected
        marker = await a.mark_lost(12, LEASE)
        assert marker is not None
        deadline = time.monotonic() + 5.0
        while True:
            record = await asyncio.wait_for(seen.get(), timeout=deadline - time.monotonic())
            if record is not None and record.forgotten:
                break
        assert record.term == 12


async def test_a_renewal_never_overwrites_a_later_grant(harness: StoreHarness) -> None:
    """Putting a grant back is only for a store that lost it: a later grant, or a release of
    our own grant, is never overwritten."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    await a.release("a_1", granted.term)
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, LEASE)
    later = await take(b, "b_1")
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, LEASE)
    current = await b.read()
    assert current is not None
    assert (current.holder, current.term) == ("b_1", later.term)


async def test_min_term_below_the_stored_term_does_not_lower_it(harness: StoreHarness) -> None:
    """The store's own term counts too: the grant is above both."""
    a = harness.new_store()
    first = await take(a, "a_1")
    await a.release("a_1", first.term)
    second = await take(a, "a_1")
    assert second.term == first.term + 1


@pytest.mark.parametrize("calls", [False, True], ids=["watch", "follow"])
async def test_the_watch_reports_a_release_promptly(harness: StoreHarness, calls: bool) -> None:
    """A follower's watch sees the lease become free within a second."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    async with watching(b, calls=calls) as seen:
        first = await asyncio.wait_for(seen.get(), timeout=5.0)  # connected: the current record
        assert first is not None
        assert first.holder == "a_1"
        await a.release("a_1", granted.term)
        released_at = time.monotonic()
        while True:
            remaining = released_at + 1.0 - time.monotonic()
            record = await asyncio.wait_for(seen.get(), timeout=max(remaining, 0.01))
            if record is not None and record.free:
                break
        assert time.monotonic() - released_at < 1.0


async def test_every_failure_is_a_store_error(harness: StoreHarness) -> None:
    """The elector relies on one exception family; nothing else may escape."""
    a = harness.new_store()
    granted = await take(a, "a_1")
    for call in (
        lambda: a.renew("nobody_1", granted.term, LEASE),
        lambda: a.release("nobody_1", granted.term),
        lambda: a.try_acquire("nobody_1", LEASE, 0, expected="no-such-version"),
    ):
        with pytest.raises(StoreError):
            await call()


@pytest.mark.parametrize("calls", [False, True], ids=["watch", "follow"])
async def test_the_watch_reports_every_renewal(harness: StoreHarness, calls: bool) -> None:
    """Followers time expiry by versions, so they must see each new one promptly."""
    a, b = harness.new_store(), harness.new_store()
    granted = await take(a, "a_1")
    async with watching(b, calls=calls) as seen:
        await asyncio.wait_for(seen.get(), timeout=5.0)
        renewed = await a.renew("a_1", granted.term, LEASE)
        while True:
            record = await asyncio.wait_for(seen.get(), timeout=1.0)
            if record is not None and record.version == renewed.version:
                break
