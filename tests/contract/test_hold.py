"""An operator's hold (`sidecar.hold`) on every store: a grant like any other, to no replica,
over the version read and with a newer term — so the leader it stops is refused by the store
like any stale leader, and nobody may take the lease but by waiting the hold out."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.backends.base import Conflict, LeaseHeld, LeaseRecord, NotOwned, is_hold
from sidecar.hold import TRIES, HoldRefused, hold, parse_hold, resume
from tests.contract.harness import StoreHarness
from tests.contract.test_contract import LEASE, take

HOUR = 3600.0


async def test_a_hold_is_a_newer_grant_that_refuses_the_leader_it_stopped(
    harness: StoreHarness,
) -> None:
    """The leader's renewal and release are refused (NotOwned) once the hold is written, the
    hold's term is above the leader's, and it says who set it and why."""
    leader, operator = harness.new_store(), harness.new_store()
    granted = await take(leader, "a_1")
    held = await hold(operator, "ops@laptop", "migration 42", HOUR, 5.0)
    assert is_hold(held.holder)
    assert held.holder is not None
    assert parse_hold(held.holder) == ("ops@laptop", "migration 42")
    assert held.term > granted.term
    assert held.duration == HOUR
    with pytest.raises(NotOwned):
        await leader.renew("a_1", granted.term, LEASE)
    with pytest.raises(NotOwned):
        await leader.release("a_1", granted.term)
    after = await operator.read()
    assert after is not None
    assert (after.holder, after.term) == (held.holder, held.term)


async def test_a_replica_can_take_a_held_lease_only_over_the_holds_version(
    harness: StoreHarness,
) -> None:
    """Nobody takes a hold by naming an older version (rule 1): a replica must have watched the
    hold's own version for its whole duration, as any held lease."""
    leader, operator, other = harness.new_store(), harness.new_store(), harness.new_store()
    granted = await take(leader, "a_1")
    held = await hold(operator, "ops", "", HOUR, 5.0)
    with pytest.raises(LeaseHeld):
        await other.try_acquire("b_1", LEASE, granted.term, expected=granted.version)
    after = await other.try_acquire("b_1", LEASE, held.term, expected=held.version)
    assert after.holder == "b_1"
    assert after.term > held.term


async def test_resume_frees_the_lease_at_once_and_the_next_grant_is_above_the_hold(
    harness: StoreHarness,
) -> None:
    leader, operator, other = harness.new_store(), harness.new_store(), harness.new_store()
    await take(leader, "a_1")
    held = await hold(operator, "ops", "", HOUR, 5.0)
    released = await resume(operator, 5.0)
    assert released is not None
    assert released.free
    granted = await other.try_acquire("b_1", LEASE, 0, expected=released.version)
    assert granted.term > held.term
    assert await resume(operator, 5.0) is None  # not on hold any more: nothing to do


async def test_a_hold_over_no_record_and_again_over_a_hold(harness: StoreHarness) -> None:
    """Holding a lease nobody ever took works; holding again replaces the hold (a newer term,
    the new reason)."""
    operator = harness.new_store()
    first = await hold(operator, "ops", "one", HOUR, 5.0)
    second = await hold(operator, "ops", "two", 60.0, 5.0)
    assert second.term > first.term
    assert second.holder is not None
    assert parse_hold(second.holder)[1] == "two"


class _Unreadable:
    """A store that holds a record it cannot decode (`sidecar.backends.records`)."""

    async def read(self) -> LeaseRecord:
        return LeaseRecord(None, 0, 0.0, "digest-1", unreadable="term: not a number")

    async def try_acquire(self, *args: object, **kwargs: object) -> LeaseRecord:
        raise AssertionError("a hold over a record it cannot read must not be written")


async def test_a_hold_refuses_a_record_it_cannot_read_rather_than_grant_a_low_term() -> None:
    """A record the store cannot decode counts its term as 0: a hold over it could repeat a
    term a fence has seen. The sidecars take such a record over with a safe term first."""
    with pytest.raises(HoldRefused, match="cannot be read"):
        await hold(_Unreadable(), "ops", "", HOUR, 5.0)  # type: ignore[arg-type]


class _AlwaysRenewed:
    """A store whose leader renews between every read and write of the hold."""

    def __init__(self) -> None:
        self.writes = 0

    async def read(self) -> LeaseRecord:
        return LeaseRecord("a_1", 3, 15.0, f"v{self.writes}")

    async def try_acquire(self, *args: object, **kwargs: object) -> LeaseRecord:
        self.writes += 1
        raise Conflict("renewed meanwhile", LeaseRecord("a_1", 3, 15.0, f"v{self.writes}"))


async def test_a_hold_that_keeps_racing_a_renewal_gives_up_after_a_bounded_number_of_tries() -> (
    None
):
    """Each try reads again after a jittered, growing pause; five, then one clear refusal."""
    store = _AlwaysRenewed()
    started = asyncio.get_running_loop().time()
    with pytest.raises(HoldRefused, match="try again"):
        await hold(store, "ops", "", HOUR, 5.0)  # type: ignore[arg-type]
    assert store.writes == TRIES
    assert asyncio.get_running_loop().time() - started >= 0.01 * sum(range(1, TRIES + 1))
