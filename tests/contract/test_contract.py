"""The lease store contract (sidecar/backends/base.py), run against every registered store."""

from __future__ import annotations

import asyncio
import time

import pytest

from sidecar.backends.base import (
    Conflict,
    LeaseHeld,
    LeaseRecord,
    LeaseStore,
    NotOwned,
    StoreBehind,
    StoreError,
)
from tests.contract.harness import StoreHarness

LEASE = 30.0  # long enough never to expire by accident during a test
SHORT = 0.5  # for the tests that wait for expiry


async def acquire_or_none(store: LeaseStore, identity: str) -> LeaseRecord | None:
    try:
        return await store.try_acquire(identity, LEASE, 0)
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


async def test_a_held_lease_refuses_another_candidate_and_says_who_holds_it(
    harness: StoreHarness,
) -> None:
    """A second candidate gets LeaseHeld with the holder's record; nothing changes."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    with pytest.raises(LeaseHeld) as held:
        await b.try_acquire("b_1", LEASE, 0)
    assert held.value.record is not None
    assert held.value.record.holder == "a_1"
    assert held.value.record.expires_in > 0
    after = await b.read()
    assert after is not None
    assert (after.holder, after.term, after.version) == ("a_1", granted.term, granted.version)


async def test_renew_by_a_non_owner_changes_nothing_and_says_so(harness: StoreHarness) -> None:
    """Renewing someone else's lease raises NotOwned and leaves the record as it was."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
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
    granted = await a.try_acquire("a_1", LEASE, 0)
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term - 1, LEASE)
    after = await a.read()
    assert after is not None
    assert after.version == granted.version


async def test_release_by_a_non_owner_changes_nothing_and_says_so(harness: StoreHarness) -> None:
    """Releasing someone else's lease raises NotOwned; the holder keeps it."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    with pytest.raises(NotOwned):
        await b.release("b_1", granted.term)
    after = await b.read()
    assert after is not None
    assert (after.holder, after.term) == ("a_1", granted.term)
    assert not after.free


async def test_the_owner_renews_and_keeps_its_term(harness: StoreHarness) -> None:
    """A renewal extends the grant without a new term; the version changes."""
    a = harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    renewed = await a.renew("a_1", granted.term, LEASE)
    assert renewed.holder == "a_1"
    assert renewed.term == granted.term
    assert renewed.version != granted.version
    assert renewed.expires_in > LEASE / 2


async def test_an_expired_lease_is_taken_by_another_with_the_next_term(
    harness: StoreHarness,
) -> None:
    """Not before it expires; after it expires, another candidate gets term + 1."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", SHORT, 0)
    started = time.monotonic()
    with pytest.raises(LeaseHeld):
        await b.try_acquire("b_1", SHORT, 0)
    taken = None
    deadline = started + SHORT + 5.0
    while taken is None and time.monotonic() < deadline:
        try:
            taken = await b.try_acquire("b_1", SHORT, 0)
        except (LeaseHeld, Conflict):
            await asyncio.sleep(0.05)
    assert taken is not None, "the expired lease was never granted to another candidate"
    assert time.monotonic() - started >= SHORT * 0.9
    assert taken.holder == "b_1"
    assert taken.term == granted.term + 1
    with pytest.raises(NotOwned):
        await a.renew("a_1", granted.term, SHORT)


async def test_a_release_lets_another_acquire_at_once(harness: StoreHarness) -> None:
    """Released means free now, with the term kept, not free after the lease runs out."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    released = await a.release("a_1", granted.term)
    assert released is None or (released.holder is None and released.term == granted.term)
    taken = await b.try_acquire("b_1", LEASE, 0)
    assert taken.holder == "b_1"
    assert taken.term == granted.term + 1


async def test_the_term_grows_with_every_grant(harness: StoreHarness) -> None:
    """Acquire, release, acquire again by anyone: each grant has a higher term."""
    stores = [harness.new_store() for _ in range(3)]
    terms = []
    for round_ in range(6):
        store = stores[round_ % 3]
        identity = f"r{round_ % 3}_1"
        granted = await store.try_acquire(identity, LEASE, 0)
        terms.append(granted.term)
        await store.release(identity, granted.term)
    assert terms == sorted(terms)
    assert len(set(terms)) == len(terms)


async def test_the_holder_acquiring_again_gets_a_new_term(harness: StoreHarness) -> None:
    """Re-acquiring one's own lease is a new grant: a new fencing token."""
    a = harness.new_store()
    first = await a.try_acquire("a_1", LEASE, 0)
    again = await a.try_acquire("a_1", LEASE, 0)
    assert again.holder == "a_1"
    assert again.term == first.term + 1


async def test_the_term_never_decreases_after_the_stored_record_is_deleted(
    harness: StoreHarness,
) -> None:
    """A reset store is behind the terms candidates have seen: it refuses, writing nothing,
    until the candidate has waited a lease and says so; then it grants above every term seen."""
    a, b = harness.new_store(), harness.new_store()
    granted = None
    for _ in range(3):
        granted = await a.try_acquire("a_1", LEASE, 0)
        await a.release("a_1", granted.term)
    assert granted is not None
    await harness.reset()
    assert await b.read() is None
    with pytest.raises(StoreBehind):
        await b.try_acquire("b_1", LEASE, granted.term)
    assert await b.read() is None, "a refused grant must write nothing"
    taken = await b.try_acquire("b_1", LEASE, granted.term, after_reset=True)
    assert taken.holder == "b_1"
    assert taken.term == granted.term + 1


async def test_a_held_lease_is_reported_held_even_to_a_candidate_with_a_higher_floor(
    harness: StoreHarness,
) -> None:
    """'Behind' is only about a free lease: a live holder is reported as such."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    with pytest.raises(LeaseHeld):
        await b.try_acquire("b_1", LEASE, granted.term + 5)
    with pytest.raises(LeaseHeld):
        await b.try_acquire("b_1", LEASE, granted.term + 5, after_reset=True)


async def test_a_floor_equal_to_the_stored_term_is_not_behind(harness: StoreHarness) -> None:
    """The usual case: a candidate's floor is the term it last saw, which the store has."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    await a.release("a_1", granted.term)
    taken = await b.try_acquire("b_1", LEASE, granted.term)
    assert taken.term == granted.term + 1


async def test_min_term_below_the_stored_term_does_not_lower_it(harness: StoreHarness) -> None:
    """The store's own term counts too: the grant is above both."""
    a = harness.new_store()
    first = await a.try_acquire("a_1", LEASE, 0)
    await a.release("a_1", first.term)
    second = await a.try_acquire("a_1", LEASE, 0)
    assert second.term == first.term + 1


async def test_the_watch_reports_a_release_promptly(harness: StoreHarness) -> None:
    """A follower's watch sees the lease become free within a second."""
    a, b = harness.new_store(), harness.new_store()
    granted = await a.try_acquire("a_1", LEASE, 0)
    seen: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()

    async def follow() -> None:
        async for record in b.watch():
            await seen.put(record)

    watcher = asyncio.create_task(follow())
    try:
        await asyncio.sleep(0.3)  # let the watch connect
        await a.release("a_1", granted.term)
        released_at = time.monotonic()
        while True:
            remaining = released_at + 1.0 - time.monotonic()
            record = await asyncio.wait_for(seen.get(), timeout=max(remaining, 0.01))
            if record is None or record.free:
                break
        assert time.monotonic() - released_at < 1.0
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_every_failure_is_a_store_error(harness: StoreHarness) -> None:
    """The elector relies on one exception family; nothing else may escape."""
    a = harness.new_store()
    for call in (
        lambda: a.renew("nobody_1", 1, LEASE),
        lambda: a.release("nobody_1", 1),
    ):
        with pytest.raises(StoreError):
            await call()
