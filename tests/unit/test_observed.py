"""`LeaseView`, the one place expiry is decided (rules 2, 5 and 8), on its own: pure
bookkeeping, every observation stamped with the time its answer arrived."""

from __future__ import annotations

from sidecar.backends.base import LeaseRecord
from sidecar.backends.records import unreadable_lease
from sidecar.observed import LOSS_TERM_GAP, LeaseView

LEASE = 10.0
ME = "me_1"


def held(version: str, term: int = 3, holder: str = "x_1") -> LeaseRecord:
    return LeaseRecord(holder=holder, term=term, duration=LEASE, version=version)


def test_a_held_version_expires_a_lease_after_this_replica_first_saw_it() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(held("v1"), at=100.0)
    view.observe(held("v1"), at=105.0)  # seen again: the count goes on from 100
    attempt = view.next_attempt(105.0)
    assert (attempt.at, attempt.expected, attempt.why) == (110.0, "v1", "expired")


def test_a_new_version_restarts_the_count() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(held("v1"), at=100.0)
    view.observe(held("v2"), at=108.0)
    assert view.next_attempt(108.0).at == 118.0


def test_released_own_and_new_are_free_at_once() -> None:
    view = LeaseView(ME, LEASE)
    assert view.next_attempt(1.0).why == "new"  # nothing seen yet: try as for a new lease
    released = LeaseRecord(holder=None, term=3, duration=LEASE, version="r", released=True)
    view.observe(released, at=2.0)
    assert (view.next_attempt(2.0).at, view.next_attempt(2.0).why) == (2.0, "released")
    view.observe(held("v9", term=4, holder=ME), at=3.0)  # (a grant after a release: above it)
    assert (view.next_attempt(3.0).at, view.next_attempt(3.0).why) == (3.0, "own")


def test_a_release_naming_a_successor_is_left_to_it_for_the_stand_back() -> None:
    """The others leave a lease released to a named replica to it for ``stand_back`` seconds
    from when they saw the release (a transfer where the store cannot hand over); the named
    replica takes it at once."""
    released = LeaseRecord(
        holder=None, term=3, duration=LEASE, version="r", released=True, successor="next_1"
    )
    other = LeaseView(ME, LEASE, stand_back=2.0)
    other.observe(released, at=5.0)
    assert (other.next_attempt(6.0).at, other.next_attempt(6.0).why) == (7.0, "released")
    assert other.next_attempt(8.0).at == 8.0
    named = LeaseView("next_1", LEASE, stand_back=2.0)
    named.observe(released, at=5.0)
    assert (named.next_attempt(5.0).at, named.next_attempt(5.0).why) == (5.0, "handed")


def test_a_holder_the_store_lost_track_of_is_waited_out_like_a_held_one() -> None:
    """No holder, not released (a Redis key gone early): not free."""
    view = LeaseView(ME, LEASE)
    view.observe(LeaseRecord(holder=None, term=3, duration=0.0, version="absent.3"), at=50.0)
    assert view.next_attempt(50.0).at == 50.0 + LEASE


def test_a_loss_is_waited_out_and_the_next_term_jumps() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=7), at=0.0)
    assert view.observe(None, at=1.0, from_watch=True)  # the store lost everything
    attempt = view.next_attempt(1.0)
    assert (attempt.at, attempt.expected, attempt.why) == (11.0, None, "lost")
    assert attempt.min_term == 7 + LOSS_TERM_GAP
    assert not view.observe(None, at=4.0)  # the same loss, read again: no new wait


def test_each_loss_starts_its_own_wait_and_jumps_further() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=7), at=0.0)
    view.observe(None, at=1.0, from_watch=True)
    assert view.observe(None, at=6.0, from_watch=True)  # the store changed again
    attempt = view.next_attempt(6.0)
    assert attempt.at == 16.0
    assert attempt.min_term == 7 + 2 * LOSS_TERM_GAP


def test_a_lower_term_is_a_loss_and_a_current_grant_ends_it() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=7), at=0.0)
    assert view.observe(held("old", term=5), at=1.0)
    attempt = view.next_attempt(1.0)
    assert attempt.why == "lost"
    assert attempt.min_term == 7 + LOSS_TERM_GAP  # the rewound store does not lower the floor
    view.observe(held("v2", term=2008), at=2.0)
    assert view.loss_since is None
    assert view.losses_in_a_row == 0
    assert view.next_attempt(2.0).why == "expired"


def test_losses_missed_while_seeing_nothing_count_one_per_lease_of_silence() -> None:
    """A watch down through a loss, the grant after it (which waited a lease) and a second
    loss shows one loss where there were two: the silence before it counts the other, so this
    grant's term jumps above the forgotten one."""
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=7), at=0.0)
    view.observe(None, at=2.5 * LEASE, from_watch=True)  # back after 2.5 leases of nothing
    assert view.losses_in_a_row == 1 + 2
    assert view.next_attempt(2.5 * LEASE).min_term == 7 + 3 * LOSS_TERM_GAP


def test_a_term_granted_again_is_a_loss_once_not_at_every_renewal() -> None:
    """y held term 5; the store forgot it and granted 5 to z (a hand-over from a leader that
    never saw y's grant, say). One loss, waited out from when it was seen; z's renewals
    after it are z's lease, timed as usual, not a new loss each."""
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=5, holder="y_1"), at=0.0)
    assert view.observe(held("v2", term=5, holder="z_1"), at=1.0)
    assert view.next_attempt(1.0).why == "lost"
    assert not view.observe(held("v3", term=5, holder="z_1"), at=2.0)
    assert view.losses_in_a_row == 0
    assert view.next_attempt(2.0).at == 2.0 + LEASE


def test_a_grant_of_a_term_seen_released_is_a_loss() -> None:
    """A grant after a release always has a higher term: one at the released term is a grant
    the store forgot, made again."""
    view = LeaseView(ME, LEASE)
    released = LeaseRecord(holder=None, term=5, duration=LEASE, version="r", released=True)
    view.observe(released, at=0.0)
    assert view.observe(held("v2", term=5, holder="z_1"), at=1.0)
    assert view.next_attempt(1.0).why == "lost"


def test_a_holder_putting_its_grant_back_over_its_marker_is_no_new_loss() -> None:
    """The normal recovery: y's grant, the store loses it (a marker of term 5), y puts it
    back. The loss ends when y's grant is shown again."""
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=5, holder="y_1"), at=0.0)
    marker = LeaseRecord(holder=None, term=5, duration=LEASE, version="m")
    assert view.observe(marker, at=1.0)
    assert not view.observe(held("v2", term=5, holder="y_1"), at=2.0)
    assert view.loss_since is None


def test_a_record_that_cannot_be_read_is_waited_out_then_taken_over_its_version() -> None:
    """Issue 25: a record of unknown holder (a hand edit, a restore, a foreign writer) is a
    loss: waited out a lease from when it was first seen, then taken only over that version,
    with a term above every term seen; its own term is never remembered."""
    view = LeaseView(ME, LEASE)
    view.observe(held("v1", term=7), at=0.0)
    assert view.observe(unreadable_lease("v2", "term: 9223372036854775807 is outside"), at=1.0)
    attempt = view.next_attempt(1.0)
    assert (attempt.at, attempt.expected, attempt.why) == (11.0, "v2", "lost")
    assert attempt.min_term == 7 + LOSS_TERM_GAP
    assert view.high_water == 7


def test_a_replica_that_saw_nothing_still_waits_out_a_record_it_cannot_read() -> None:
    view = LeaseView(ME, LEASE)
    view.observe(unreadable_lease("v1", "holder: not text (b'\\xff')"), at=5.0)
    attempt = view.next_attempt(5.0)
    assert (attempt.at, attempt.expected, attempt.why) == (15.0, "v1", "lost")
    assert attempt.min_term == LOSS_TERM_GAP
