"""What a hand edit puts in the PostgreSQL tables (issue 25): the columns are typed, but a
term of 2^63 - 1, a holder with control characters or a NaN lease still fit. Each reads as a
record of unknown holder, the next grant neither overflows nor passes what the store holds,
and the lease is taken over only over exactly what is stored."""

from __future__ import annotations

import pytest

from sidecar.backends.base import Candidate, LeaseHeld, NotOwned, TermExhausted
from sidecar.backends.records import MAX_TERM
from tests.postgresql.conftest import ClientFactory, Database

pytestmark = pytest.mark.slow

POISONS = {
    "term-2^63-1": "term = 9223372036854775807",
    "term-negative": "term = -5",
    "holder-escape": "holder = 'x' || chr(27) || '[2J'",
    "duration-nan": "duration = 'NaN'",
}


@pytest.mark.parametrize("poison", POISONS, ids=list(POISONS))
async def test_a_poisoned_row_is_unknown_and_taken_over_only_over_its_version(
    database: Database, make_client: ClientFactory, poison: str
) -> None:
    lease = make_client(database.url).lease("jobs")
    granted = await lease.try_acquire("a_1", 5.0, 0, expected=None)
    database.sql(f"UPDATE leader_sidecar.leases SET {POISONS[poison]} WHERE name = 'jobs'")
    found = await lease.read()
    assert found is not None
    assert found.unreadable is not None
    assert (found.holder, found.term, found.free, found.forgotten) == (None, 0, False, False)
    if poison == "duration-nan":
        # Holder and term are intact: the holder's renewal (conditional on them) rewrites the
        # lease and the record reads again.
        renewed = await lease.renew("a_1", granted.term, 5.0)
        assert (renewed.unreadable, renewed.duration) == (None, 5.0)
        return
    with pytest.raises(NotOwned):  # nobody renews or puts back what it cannot read
        await lease.renew("a_1", granted.term, 5.0)
    with pytest.raises(LeaseHeld):
        await lease.try_acquire("b_1", 5.0, 0, expected=None)
    taken = await lease.try_acquire("b_1", 5.0, 1000, expected=found.version)
    assert (taken.holder, taken.term, taken.unreadable) == ("b_1", 1001, None)


async def test_no_grant_passes_the_highest_term_the_store_holds(
    database: Database, make_client: ClientFactory
) -> None:
    lease = make_client(database.url).lease("jobs")
    granted = await lease.try_acquire("a_1", 5.0, MAX_TERM - 2, expected=None)
    assert granted.term == MAX_TERM - 1
    released = await lease.release("a_1", granted.term)
    assert released is not None
    taken = await lease.try_acquire("b_1", 5.0, 0, expected=released.version)
    assert taken.term == MAX_TERM
    with pytest.raises(TermExhausted, match="refusing to grant"):
        await lease.hand_over(
            "b_1", MAX_TERM, successor="c_1", handed="1", duration=5.0, min_term=0
        )
    again = await lease.release("b_1", MAX_TERM)
    assert again is not None
    with pytest.raises(TermExhausted, match="refusing to grant"):
        await lease.try_acquire("c_1", 5.0, 0, expected=again.version)
    assert (await lease.read()) == again


async def test_candidate_rows_nobody_can_read_are_left_out(
    database: Database, make_client: ClientFactory
) -> None:
    group = make_client(database.url).candidates("jobs")
    await group.beat(Candidate("a_1", "11"), 5.0)
    database.sql(
        "INSERT INTO leader_sidecar.candidates VALUES "
        "('jobs', 'x' || chr(27) || ']0;owned' || chr(7), '3', '', 0, false, NULL, now()), "
        "('jobs', 'y_1', '3', '', 2000000000, false, NULL, now())"
    )
    found = await group.list()
    assert sorted(c.identity for c in found if c.unreadable is None) == ["a_1"]
    assert len([c for c in found if c.unreadable is not None]) == 2
    await group.beat(Candidate("a_1", "12"), 5.0)
