"""The elector on an in-memory store and a hand-moved clock: one test per safety rule, plus
the scheduling behaviour. Every store call is counted; a call a test did not allow fails it."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore, _Row
from sidecar.backends.records import MAX_TERM
from sidecar.changes import ChangeFeed
from sidecar.config import load
from sidecar.elector import Elector
from sidecar.lease_set import LeaseSet
from sidecar.metrics import Metrics
from sidecar.observed import LOSS_TERM_GAP
from sidecar.status import Role, Transition
from sidecar.timing import Timing
from tests.support.clock import FakeClock, run_alone
from tests.support.strict_store import StrictStore

TIMING = Timing(lease_duration=10.0, renew_interval=3.0, retry_period=1.0, request_timeout=1.0)
# One request timeout + 1 % of the lease for drift (rule 3), written out rather than read from
# the code under test, so a margin taken out of the code fails the deadline tests.
MARGIN = 1.0 + 0.01 * 10.0


class World:
    """One lease 'server', a shared clock, and the electors the test creates."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.state = MemoryLeaseState(self.clock)
        self.stores: list[StrictStore] = []

    def elector(
        self, name: str, allowed: set[str] | None = None, beats: dict[str, float] | None = None
    ) -> Elector:
        """``beats``: the candidate versions this replica sent, and when (monotonic)."""
        store = StrictStore(self.state, allowed)
        self.stores.append(store)
        registry = CollectorRegistry()
        return Elector(
            store,
            TIMING,
            f"{name}_0000",
            "unit",
            metrics=Metrics(registry, "unit", TIMING.lease_duration),
            clock=self.clock,
            rng=random.Random(7),
            beat_sent_at=beats.get if beats is not None else None,
        )

    def steal(self, holder: str) -> None:
        """Another writer takes the lease behind the elector's back, with a newer term."""
        row = self.state.row
        assert row is not None
        row.holder, row.term = holder, row.term + 1
        row.version = self.state.next_version()


@pytest.fixture
def world() -> Iterator[World]:
    world = World()
    yield world
    for store in world.stores:
        assert store.unexpected == [], f"unexpected store calls: {store.unexpected}"


def store_of(elector: Elector) -> StrictStore:
    assert isinstance(elector.store, StrictStore)
    return elector.store


def sample(elector: Elector, name: str, **labels: str) -> float | None:
    return elector.metrics.registry.get_sample_value(
        name, {"lease": "unit", "lease_group": "unit", **labels}
    )


def demotions(elector: Elector, reason: str) -> float | None:
    return sample(elector, "leader_sidecar_demotions_total", reason=reason)


# -- acquiring and following ------------------------------------------------------------------


async def test_a_lone_candidate_becomes_leader_with_term_one(world: World) -> None:
    """One acquire call, then leader with term 1 until the deadline."""
    a = world.elector("a")
    delay = await a.step()
    status = a.status()
    assert status.leader
    assert (status.holder, status.term) == ("a_0000", 1)
    assert status.valid_for == pytest.approx(TIMING.lease_duration - MARGIN)
    assert delay == pytest.approx(TIMING.renew_interval)
    assert store_of(a).calls == {"acquire": 1}


async def test_no_reader_sees_leader_with_the_previous_roles_fields(world: World) -> None:
    """The listeners read `status()` from another thread, without a lock, at any moment of a
    transition. Here a reader runs at the one call the transition makes in its middle (the
    wall clock, for ``since``): it must not see ``leader`` true with the follower period's
    ``since`` (the sharded chaos run, seed 3303, saw exactly that answer)."""
    a = world.elector("a")
    seen = []
    wall = world.clock.wall

    def wall_with_a_reader() -> object:
        seen.append(a.status())
        return wall()

    world.clock.wall = wall_with_a_reader  # type: ignore[method-assign]
    follower_since = a.status().since
    world.clock.advance(1.0)
    await a.step()
    assert a.status().leader
    assert seen, "no read happened inside the transition"
    torn = [s for s in seen if s.leader and s.since == follower_since]
    assert torn == []


async def test_a_follower_schedules_its_next_attempt_at_the_observed_expiry(world: World) -> None:
    """Not a fixed poll, and not the store's idea of expiry: the next attempt is one lease
    after this follower first saw the holder's current version (rule 2)."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    world.clock.advance(4.0)
    delay = await b.step()
    assert not b.status().leader
    assert b.status().holder == "a_0000"
    assert TIMING.lease_duration <= delay <= TIMING.lease_duration + 0.1
    assert store_of(b).calls == {"acquire": 1}


async def test_a_new_version_restarts_the_followers_count(world: World) -> None:
    """Each renewal is a new version: a follower that sees it waits a lease from then."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    world.clock.advance(TIMING.renew_interval)
    await a.step()  # renewed: a new version
    b.on_watch(world.state.record())
    world.clock.advance(TIMING.lease_duration - 0.5)  # past the first version's expiry
    await b.step()
    assert not b.status().leader
    assert store_of(b).calls["acquire"] == 1, "b must not even try before the observed expiry"
    world.clock.advance(0.5)
    await b.step()
    assert b.status().leader, "a stopped renewing a lease ago: b takes over"
    assert b.status().term == 2


async def test_the_leader_renews_every_interval_and_keeps_its_term(world: World) -> None:
    """Renewal extends the deadline from the moment it was sent; the term stays."""
    a = world.elector("a")
    await a.step()
    for _ in range(5):
        world.clock.advance(TIMING.renew_interval)
        await a.step()
    assert a.status().leader
    assert a.status().term == 1
    assert store_of(a).calls == {"acquire": 1, "renew": 5}
    assert sample(a, "leader_sidecar_renewal_gap_seconds_count") == 5


# -- rule 1: the store decides ownership; the elector obeys it --------------------------------


async def test_a_leader_whose_lease_was_taken_demotes_as_lost(world: World) -> None:
    """A renewal that finds someone else's record stops leadership at once."""
    a = world.elector("a")
    await a.step()
    world.steal("x_9999")
    world.clock.advance(TIMING.renew_interval)
    await a.step()
    assert not a.status().leader
    assert a.role is Role.FOLLOWER
    assert a.status().holder == "x_9999"
    assert demotions(a, "lost") == 1


# -- rule 3: self-demotion on the leader's own deadline ----------------------------------------


async def test_a_leader_cut_off_from_the_store_demotes_at_its_deadline(world: World) -> None:
    """Errors are tolerated only while the deadline is ahead; it falls before the store's
    expiry, so no other candidate can be granted the lease while this one still leads."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    for op in ("renew", "acquire"):
        store_of(a).fail_always(op, StoreUnavailable("partitioned"))
    deadline = world.clock.now() + TIMING.lease_duration - MARGIN
    while world.clock.now() + 0.5 < deadline:
        world.clock.advance(0.5)
        await a.step()
        assert a.status().leader, "demoted while the deadline was still ahead"
    world.clock.advance(deadline - world.clock.now())
    await a.step()
    assert not a.status().leader
    assert demotions(a, "deadline") == 1
    # The store still holds a's lease at this moment: a stepped down first.
    assert world.state.row is not None
    assert world.state.row.holder == "a_0000"
    await b.step()
    assert not b.status().leader


async def test_the_deadline_counts_from_when_the_renewal_was_sent(world: World) -> None:
    """A slow renewal buys only lease - margin from its send time, not from its answer."""
    a = world.elector("a")
    await a.step()
    world.clock.advance(TIMING.renew_interval)
    store_of(a).during["renew"] = lambda: world.clock.advance(0.8)
    await a.step()
    assert a.status().leader
    assert a.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN - 0.8)


async def test_a_renewal_confirmed_after_the_deadline_does_not_extend_it(world: World) -> None:
    """The store said yes too late: /leader already said 503, so the leader steps down."""
    a = world.elector("a")
    await a.step()
    world.clock.advance(TIMING.renew_interval)
    store_of(a).during["renew"] = lambda: world.clock.advance(TIMING.lease_duration)
    await a.step()
    assert not a.status().leader
    assert demotions(a, "deadline") == 1


async def test_a_passing_store_error_is_tolerated_while_the_deadline_is_ahead(
    world: World,
) -> None:
    """One failed renewal: retry soon, stay leader, no demotion."""
    a = world.elector("a")
    await a.step()
    world.clock.advance(TIMING.renew_interval)
    store_of(a).fail_next("renew", StoreUnavailable("blip"))
    delay = await a.step()
    assert a.status().leader
    assert delay <= TIMING.retry_period * 1.5
    world.clock.advance(delay)
    await a.step()
    assert a.status().leader
    assert demotions(a, "deadline") == 0
    assert store_of(a).calls["renew"] == 2


# -- rule 4: answered at request time ----------------------------------------------------------


async def test_leadership_is_judged_at_the_moment_of_asking(world: World) -> None:
    """Past the deadline the answer is 'not leader' at once, with no step in between:
    a paused sidecar that resumes late answers 503 on its first request."""
    a = world.elector("a")
    await a.step()
    assert a.status().leader
    assert sample(a, "leader_sidecar_is_leader") == 1
    world.clock.advance(TIMING.lease_duration - MARGIN)
    assert not a.status().leader
    assert not a.is_leader()
    assert sample(a, "leader_sidecar_is_leader") == 0
    assert a.role is Role.LEADER  # the loop has not run yet; the answer is right anyway


async def test_a_status_handed_out_again_is_never_one_from_before_the_deadline(
    world: World,
) -> None:
    """`status` hands out the one it built last while nothing in it changed: one asked in
    the last half millisecond before the deadline (``valid_for`` rounds to 0) is not the
    answer a moment after the deadline, however alike the rest."""
    a = world.elector("a")
    await a.step()
    world.clock.advance(TIMING.lease_duration - MARGIN - 0.0002)
    last_moment = a.status()
    assert last_moment.leader
    assert last_moment.valid_for == 0.0
    world.clock.advance(0.0004)
    assert not a.status().leader
    assert a.role is Role.LEADER  # the loop has not run yet


# -- rule 5: the term never goes back ----------------------------------------------------------


async def test_a_leader_whose_record_the_store_lost_puts_it_back(world: World) -> None:
    """The store forgot the grant (restart without persistence, deleted record): the leader's
    next renewal writes it back with its own term, so the term stays used (rule 5) and the
    others keep seeing a holder."""
    a, b = world.elector("a"), world.elector("b")
    for _ in range(3):
        await a.step()
        await a.release()
        world.clock.advance(TIMING.lease_duration)
    await a.step()
    assert a.status().term == 4
    await b.step()  # b observes term 4
    world.state.delete()
    world.clock.advance(TIMING.renew_interval)
    await a.step()  # a's renewal finds no record: it puts its grant back
    assert a.status().leader
    assert a.status().term == 4
    assert world.state.row is not None
    assert (world.state.row.holder, world.state.row.term) == ("a_0000", 4)
    assert demotions(a, "lost") is None or demotions(a, "lost") == 0


async def test_a_leader_that_sees_its_record_gone_renews_at_once(world: World) -> None:
    """Told by the watch that the store lost its grant, the leader does not wait for its next
    renewal: it renews (and so restores) now."""
    a = world.elector("a")
    await a.step()
    world.state.delete()
    a.on_watch(None)
    assert a.status().leader
    assert a._next_attempt <= world.clock.now()
    await a.step()
    assert world.state.row is not None
    assert world.state.row.holder == "a_0000"


async def test_a_loss_the_watch_shows_is_written_down_at_once_for_replicas_that_start_later(
    world: World,
) -> None:
    """The watch shows b the store holding nothing where it had shown term 1: b steps within
    its herd jitter (not a lease later) and writes a loss marker of term 1. A replica that
    starts now sees the marker, waits it out as a loss and jumps — never grants term 1 again.
    The leader the store forgot puts its grant back over the marker."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    world.state.delete()
    b.on_watch(None)
    assert b._next_attempt <= world.clock.now() + 0.05
    await b.step()
    marker = world.state.record()
    assert marker is not None
    assert (marker.holder, marker.term, marker.forgotten) == (None, 1, True)
    c = world.elector("c")
    await c.step()
    assert not c.status().leader
    attempt = c.view.next_attempt(world.clock.now())
    assert (attempt.why, attempt.min_term) == ("lost", 1 + LOSS_TERM_GAP)
    assert attempt.at >= world.clock.now() + TIMING.lease_duration
    a.on_watch(marker)  # the holder sees its own term written down without it: put back
    await a.step()
    restored = world.state.record()
    assert restored is not None
    assert (restored.holder, restored.term) == ("a_0000", 1)
    assert a.status().leader


async def test_a_release_below_a_term_seen_is_written_over_by_a_loss_marker(world: World) -> None:
    """The store forgot a grant of term 2 before anyone saw it go (a Redis key deleted by hand,
    which publishes nothing; its holder stopped before its next renewal), and z, starting just
    then, saw nothing and granted term 1 again: the README's limit. k had seen term 2: a lower
    term is a loss, but the store held z's grant, nothing a marker may replace. z then
    released, and after its stand-back took its own release again, at term 2, a term k had
    seen granted to another: a fence accepts both (chaos, Redis n=5, seed 2124476148, at term
    3). k writes the term it saw over the lower release, so z waits it out and jumps too."""
    wall = world.clock.wall()
    world.state.row = _Row("x_9999", 2, 10.0, world.state.next_version(), False, wall, wall)
    k = world.elector("k")
    await k.step()  # k saw term 2, granted to x
    world.state.delete()  # unseen: no watch event reaches k
    z = world.elector("z")
    await z.step()
    assert (z.status().leader, z.status().term) == (True, 1)  # blind: the documented limit
    assert await z.release()  # before k sees z's grant (that it would write over: below)
    released = world.state.record()
    assert released is not None
    assert (released.released, released.term) == (True, 1)
    k.on_watch(released)
    world.clock.advance(TIMING.retry_period)
    await k.step()
    marker = world.state.record()
    assert marker is not None
    assert (marker.holder, marker.term, marker.forgotten) == (None, 2, True)
    world.clock.advance(TIMING.lease_duration + 0.1)  # z's stand-back is over
    z.on_watch(marker)
    await z.step()
    held = world.state.record()
    assert held is not None
    assert not (held.holder == "z_0000" and held.term <= 2), "term 2 granted twice"
    assert not z.status().leader
    attempt = z.view.next_attempt(world.clock.now())
    assert attempt.why == "lost"
    assert attempt.min_term > 2 + LOSS_TERM_GAP - 1


async def test_a_grant_below_a_term_seen_is_written_over_and_its_count_cannot_climb_back(
    world: World,
) -> None:
    """The store forgot x's grant of term 2 unseen, and z, starting just then, granted term 1
    again (the documented limit: it saw nothing). Left alone, z's count climbs through its own
    grants — a renewal it gave up on and took back, a release it took again — to term 2,
    which a fence already accepted from x. k saw term 2: it writes that term down over z's
    lower grant at once, z's next renewal is refused and it stops, and the next grant, by
    anyone, is above every term seen."""
    wall = world.clock.wall()
    world.state.row = _Row("x_9999", 2, 10.0, world.state.next_version(), False, wall, wall)
    k = world.elector("k")
    await k.step()  # k saw term 2, granted to x
    world.state.delete()  # unseen: no watch event reaches k
    z = world.elector("z")
    await z.step()
    assert (z.status().leader, z.status().term) == (True, 1)  # blind: the documented limit
    k.on_watch(world.state.record())  # a lower term: a loss, and a grant below the term seen
    assert k._next_attempt <= world.clock.now() + 0.05  # within its herd jitter
    await k.step()
    marker = world.state.record()
    assert marker is not None
    assert (marker.holder, marker.term, marker.forgotten) == (None, 2, True)
    assert not k.status().leader
    world.clock.advance(TIMING.renew_interval)
    await z.step()  # its renewal finds the marker of a term above its own
    assert not z.status().leader
    assert world.state.record() == marker
    world.clock.advance(TIMING.lease_duration + 0.1)
    for elector in (z, k):
        elector.on_watch(marker)
        await elector.step()
    held = world.state.record()
    assert held is not None
    assert held.holder in ("z_0000", "k_0000")
    assert held.term > 2 + LOSS_TERM_GAP - 1, "a term at or below one seen granted again"


async def test_after_a_store_reset_nobody_leads_until_the_old_holder_must_have_stopped(
    world: World,
) -> None:
    """A store that lost its record cannot show the holder, which may still lead until its
    own deadline: candidates wait one lease from when they first see the loss, then grant a
    term far above every term seen (a grant the store forgot may have used the next one)."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()  # b has seen term 1
    world.state.delete()  # e.g. Redis restarted without persistence; a is partitioned
    reset_seen = world.clock.now() + 0.1
    world.clock.advance(0.1)
    b.on_watch(None)  # the watch reports the loss
    delay = await b.step()
    assert not b.status().leader
    assert delay >= TIMING.lease_duration
    marker = world.state.record()  # b wrote the loss down for replicas that start later
    assert marker is not None
    assert (marker.forgotten, marker.term) == (True, 1)
    assert a.status().leader  # a has not renewed yet: it still leads, and b must not
    waited_out = reset_seen + TIMING.lease_duration
    while world.clock.now() + 0.5 < waited_out:
        world.clock.advance(0.5)
        await b.step()
        assert not b.status().leader
    world.clock.advance(waited_out - world.clock.now() + 0.1)
    assert not a.status().leader  # a's own deadline came first
    await b.step()
    assert b.status().leader
    # Two losses in a row: the store changed after the loss (b's own marker), and a put-back
    # and a second loss could hide in between; the wait restarted there too.
    assert b.status().term == 1 + 2 * LOSS_TERM_GAP + 1


async def test_case1_a_second_loss_is_waited_out_on_its_own(world: World) -> None:
    """Issue 9, case 1: two losses in a row. The wait for the first must not cover the
    second, whose forgotten holder (b, granted after the first) is inside its deadline."""
    a, b, c = world.elector("a"), world.elector("b"), world.elector("c")
    await a.step()
    await b.step()
    await c.step()
    world.state.delete()  # loss 1; a is cut off from now on
    b.on_watch(None)
    c.on_watch(None)
    world.clock.advance(TIMING.lease_duration + 0.1)
    await b.step()
    assert b.status().leader  # loss 1 waited out
    c.on_watch(world.state.record())  # c sees b's grant
    world.clock.advance(1.0)
    world.state.delete()  # loss 2: b is partitioned from now on, and leads until its deadline
    c.on_watch(None)
    second_loss = world.clock.now()
    while world.clock.now() < second_loss + TIMING.lease_duration - 0.5:
        world.clock.advance(0.5)
        await c.step()
        assert not (c.status().leader and b.status().leader), "two leaders at once"
        assert not c.status().leader, "the second loss was not waited out"
    world.clock.advance(1.0)
    await c.step()
    assert c.status().leader
    assert c.status().term > b.status().term


async def b_leads_after_a_loss(world: World, a: Elector, b: Elector, c: Elector) -> int:
    """a leads term 1 and b and c see it; the store loses everything (loss 1), both watches
    show it, and b, after waiting it out, leads. Returns b's term (c has not seen it)."""
    await a.step()
    await b.step()
    await c.step()
    world.state.delete()  # loss 1
    b.on_watch(None)
    c.on_watch(None)
    world.clock.advance(TIMING.lease_duration + 0.1)
    await b.step()
    assert b.status().leader
    return b.status().term


async def test_case1_a_loss_whose_grant_was_never_seen_jumps_further(world: World) -> None:
    """Two losses, and the grant between them never reached c (its watch only said "the
    store changed, and holds nothing"): c waits anew and takes a term above b's."""
    a, b, c = world.elector("a"), world.elector("b"), world.elector("c")
    b_term = await b_leads_after_a_loss(world, a, b, c)
    world.state.delete()  # before c saw b's grant
    c.on_watch(None)
    second_loss = world.clock.now()
    await c.step()  # the step the watch asks for: c writes the loss down
    world.clock.advance(TIMING.lease_duration - 0.1)
    await c.step()
    assert not c.status().leader
    world.clock.advance(second_loss + TIMING.lease_duration + 0.1 - world.clock.now())
    await c.step()
    assert c.status().leader
    assert c.status().term > b_term


async def test_case1_a_second_rollback_hidden_by_an_outage_is_waited_out_too(
    world: World,
) -> None:
    """As below, but the store rolls back to an older grant (a failover to a replica that
    missed writes) and, the second time, shows c exactly the version it saw the first time:
    nothing looks changed. Only the failed request tells c that the store may have lost a
    grant meanwhile (b's): it must wait again, not take it (it writes the term it saw down over
    the old grant instead)."""
    a, b, d = world.elector("a"), world.elector("b"), world.elector("d")
    c = world.elector("c", {"acquire", "read", "mark_lost"})
    await a.step()
    old_grant = dataclasses.replace(world.state.row)  # term 1, as the stale replica has it
    await a.release()
    await d.step()  # d leads term 2, then is cut off for good
    await b.step()
    await c.step()  # b and c have seen term 2

    def roll_back() -> None:
        world.state.row = dataclasses.replace(old_grant)
        world.state.notify()

    roll_back()  # loss 1
    b.on_watch(world.state.record())
    c.on_watch(world.state.record())
    world.clock.advance(TIMING.lease_duration + 0.1)
    await b.step()
    assert b.status().leader
    store_of(c).fail_next("acquire", StoreUnavailable("the store fails over again"))
    await c.step()  # meanwhile the store forgets b's grant: the same old version again
    roll_back()  # loss 2, unseen by c
    world.clock.advance(TIMING.retry_period * 1.5)
    await c.step()  # reads: the store shows the version c saw before the outage
    await c.step()
    assert b.status().leader
    assert not c.status().leader, "took the lease while the grant it could not see still led"


async def test_case1_a_loss_marker_shown_again_after_an_outage_is_waited_out_again(
    world: World,
) -> None:
    """c saw the store lose term 2 and b write it down (a loss marker of c's own highest
    term: no marker of c's can go over it). While c could not reach the store, b waited the
    marker out and led, and the store forgot b's grant: it shows c the very marker it saw
    before. Nothing looks changed, and c's wait from the first loss is long over; only the
    failed request tells c that a grant may have come and gone meanwhile. It must wait again
    and jump two losses, not take the lease at once at b's term."""
    b = world.elector("b")
    c = world.elector("c", {"acquire", "read", "mark_lost"})
    wall = world.clock.wall()
    world.state.row = _Row("x_9999", 2, 10.0, world.state.next_version(), False, wall, wall)
    await b.step()
    await c.step()  # b and c saw term 2
    world.state.delete()  # loss 1
    b.on_watch(None)
    await b.step()  # b writes the loss down
    marker_row = dataclasses.replace(world.state.row)
    marker = world.state.record()
    assert marker is not None
    assert (marker.term, marker.forgotten) == (2, True)
    c.on_watch(marker)
    world.clock.advance(TIMING.lease_duration + 0.1)
    b.on_watch(marker)
    await b.step()
    assert b.status().leader
    b_term = b.status().term
    store_of(c).fail_next("acquire", StoreUnavailable("the store fails over"))
    await c.step()  # c's attempt meets the outage; meanwhile the store forgets b's grant
    world.state.row = dataclasses.replace(marker_row)  # the marker c saw, version and all
    world.clock.advance(TIMING.retry_period * 1.5)
    await c.step()
    await c.step()
    assert not c.status().leader, "took the lease at once after an outage that hid a grant"
    attempt = c.view.next_attempt(world.clock.now())
    assert attempt.why == "lost"
    assert attempt.min_term > b_term


async def test_case1_a_second_loss_hidden_by_an_outage_is_waited_out_too(world: World) -> None:
    """The sharded chaos run (seed 1555969620): c waits out a loss; b, granted after it, is
    forgotten by a second loss while c cannot reach the store (its attempt fails), and c's
    watch never shows the second loss (the store looks as empty as before). c must not take
    the lease at once when the store answers again — that grant would repeat b's term."""
    a, b = world.elector("a"), world.elector("b")
    c = world.elector("c", {"acquire", "read", "mark_lost"})
    b_term = await b_leads_after_a_loss(world, a, b, c)
    store_of(c).fail_next("acquire", StoreUnavailable("the API server restarts"))
    await c.step()  # c's attempt meets the outage; meanwhile the store forgets b's grant
    world.state.delete()  # loss 2, unseen by c
    world.clock.advance(TIMING.retry_period * 1.5)
    await c.step()  # the store answers again, and looks as empty as c last saw it
    assert not c.status().leader, "took the lease right after an outage that hid a loss"
    world.clock.advance(TIMING.lease_duration + 0.1)
    await c.step()
    assert c.status().leader
    assert c.status().term > b_term


async def test_case2_a_grant_the_store_forgot_is_never_granted_again(world: World) -> None:
    """Issue 9, case 2: c was granted term 2, b never saw it, then the store lost it. b's
    grant after the loss must not be term 2 (a fence would accept both)."""
    a, b, c = world.elector("a"), world.elector("b"), world.elector("c")
    await a.step()
    await b.step()  # b saw term 1
    await a.release()
    await c.step()
    await c.step()
    assert c.status().leader
    assert c.status().term == 2
    world.state.delete()  # c is partitioned: it cannot put its grant back
    world.clock.advance(TIMING.lease_duration + 0.1)
    await b.step()  # a's record would have expired: b finds the loss instead, and waits
    assert not b.status().leader
    world.clock.advance(TIMING.lease_duration + 0.1)
    await b.step()
    assert b.status().leader
    assert b.status().term != 2
    assert b.status().term > 2


async def test_case3_a_grant_to_another_at_our_own_term_stops_us_at_once(world: World) -> None:
    """Issue 9, case 3: the watch shows our term held by someone else (a term granted twice,
    which must never happen, but if it does): stop at once, not at the next renewal."""
    a = world.elector("a")
    await a.step()
    term = a.status().term
    row = world.state.row
    assert row is not None
    row.holder, row.version = "x_9999", world.state.next_version()  # same term, other holder
    a.on_watch(world.state.record())
    assert not a.status().leader
    assert demotions(a, "lost") == 1
    assert world.state.record() is not None
    assert world.state.record().term == term


async def test_case6_a_late_renewal_naming_us_is_taken_back_at_once(world: World) -> None:
    """Issue 9, case 6: we demoted at our deadline; the store then applied our late renewal
    and shows us as holder. We take it back at once under a new term, instead of everyone
    waiting a lease for a record nobody renews."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    store_of(a).fail_always("renew", StoreUnavailable("frozen"))
    store_of(a).fail_always("acquire", StoreUnavailable("frozen"))
    world.clock.advance(TIMING.lease_duration - MARGIN)
    await a.step()
    assert not a.status().leader
    assert demotions(a, "deadline") == 1
    store_of(a).heal()
    row = world.state.row
    assert row is not None
    row.version = world.state.next_version()  # the late renewal lands
    a.on_watch(world.state.record())
    b.on_watch(world.state.record())
    await a.step()
    assert a.status().leader
    assert a.status().term == 2
    await b.step()
    assert not b.status().leader


async def test_a_grant_whose_term_is_not_above_every_term_seen_is_refused(world: World) -> None:
    """A store that forgot its term (and ignores min_term) must not make us lead."""

    class ForgetfulStore(StrictStore):
        async def try_acquire(
            self, identity: str, duration: float, min_term: int, *, expected: str | None
        ) -> LeaseRecord:
            return await super().try_acquire(identity, duration, 0, expected=expected)

    a = world.elector("a")
    await a.step()
    await a.release()
    world.state.delete()
    forgetful = ForgetfulStore(world.state)
    a.store = forgetful
    world.clock.advance(TIMING.lease_duration)
    await a.step()
    assert forgetful.calls["acquire"] == 1
    assert not a.status().leader


# -- rule 6: a new process start is a new identity ---------------------------------------------


def test_every_start_gets_a_new_identity_with_the_same_prefix(tmp_path: object) -> None:
    """Two starts of the same pod never share an identity."""
    argv = ["--identity", "app-0", "--store", "sqlite:////tmp/x.db"]
    first, second = load(argv, environ={}), load(argv, environ={})
    assert first.identity != second.identity
    assert first.identity.startswith("app-0_")
    assert second.identity.startswith("app-0_")


async def test_a_restarted_replica_does_not_inherit_its_predecessors_lease(world: World) -> None:
    """Same pod name, new suffix: it waits for expiry and takes a new term."""
    old = world.elector("app-0")
    await old.step()
    restarted = Elector(
        StrictStore(world.state),
        TIMING,
        "app-0_ffff",
        "unit",
        metrics=Metrics(CollectorRegistry(), "unit", TIMING.lease_duration),
        clock=world.clock,
    )
    await restarted.step()
    assert not restarted.status().leader
    world.clock.advance(TIMING.lease_duration)
    await restarted.step()
    assert restarted.status().leader
    assert restarted.status().term == 2


# -- rule 7: release demotes first, then frees the lease at once -------------------------------


async def test_release_demotes_locally_before_it_frees_the_lease(world: World) -> None:
    """While the release request is in flight, /leader already says 503."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    seen_during_release: list[bool] = []
    store_of(a).during["release"] = lambda: seen_during_release.append(a.status().leader)
    assert await a.release()
    assert seen_during_release == [False]
    assert demotions(a, "released") == 1
    await b.step()
    assert b.status().leader
    assert b.status().term == 2


async def test_after_a_voluntary_release_the_replica_stands_back_for_a_lease(
    world: World,
) -> None:
    """Stepping down means letting someone else lead, not re-acquiring at once."""
    a = world.elector("a")
    await a.step()
    await a.release()
    delay = await a.step()
    assert not a.status().leader
    assert delay == pytest.approx(TIMING.lease_duration)
    assert store_of(a).calls["acquire"] == 1  # only the first one


async def test_release_when_not_leading_does_nothing(world: World) -> None:
    a = world.elector("a", allowed={"acquire"})
    assert not await a.release()
    assert store_of(a).calls == {}


# -- hand-over: a release that grants the successor in the same write ---------------------


async def test_a_successor_leads_on_a_handed_grant_from_the_beat_it_was_chosen_by(
    world: World,
) -> None:
    """No write of its own: the grant counts from when the successor sent the candidate
    beat the leader chose it by (before the hand-over was written, rule 3), not from when
    it saw the grant. Its first renewal then gives it a full lease again."""
    a = world.elector("a")
    beats = {"7": world.clock.now()}
    b = world.elector("b", allowed={"renew"}, beats=beats)
    await a.step()
    world.clock.advance(2.0)  # the beat was sent 2 s before the hand-over
    assert await a.release(successor="b_0000", handed="7")
    assert store_of(a).calls["hand_over"] == 1
    assert store_of(a).calls["release"] == 0
    world.clock.advance(0.5)  # ... and seen half a second after it
    b.on_watch(world.state.record())
    delay = await b.step()
    status = b.status()
    assert status.leader
    assert (status.holder, status.term) == ("b_0000", 2)
    assert status.valid_for == pytest.approx(TIMING.lease_duration - MARGIN - 2.5)
    assert store_of(b).calls == {}
    assert delay == pytest.approx(TIMING.renew_interval - 2.5)  # on the beat's schedule
    world.clock.advance(delay)
    await b.step()
    assert b.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN)
    assert store_of(b).calls == {"renew": 1}
    record = world.state.record()
    assert record is not None
    assert record.handed is None  # the renewal ended the hand-over


async def test_a_grant_handed_by_a_beat_it_does_not_know_is_taken_with_a_write(
    world: World,
) -> None:
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire"}, beats={"7": world.clock.now()})
    await a.step()
    await a.release(successor="b_0000", handed="8")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader
    assert b.status().term == 3  # its own grant, above the handed one
    assert store_of(b).calls == {"acquire": 1}


async def test_a_handed_grant_whose_beat_leaves_no_lease_is_taken_with_a_write(
    world: World,
) -> None:
    """Rule 3: a beat more than a lease (less the margin) before now leaves nothing."""
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire"}, beats={"7": world.clock.now()})
    await a.step()
    for _ in range(3):  # a renews on its schedule, past the beat's lease
        world.clock.advance(TIMING.renew_interval)
        await a.step()
    assert a.status().leader
    await a.release(successor="b_0000", handed="7")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().term == 3
    assert b.status().valid_for == pytest.approx(TIMING.lease_duration - MARGIN)
    assert store_of(b).calls == {"acquire": 1}


async def test_a_handed_term_the_successor_saw_granted_to_another_is_a_loss(
    world: World,
) -> None:
    """Rules 5 and 8: the successor saw a grant of term 2 to y, which the store then forgot
    (it went back to a's grant of term 1); the leader a, which never saw y's grant, hands
    over with term 2 again. Two grants of one term: a loss, waited out a full lease from when
    it was seen (y may lead until its own deadline), then a grant of the successor's own with
    its term jumped — never a lead on the handed term, nor a write at once."""
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire", "read"}, beats={"7": world.clock.now()})
    await a.step()
    row = world.state.row
    assert row is not None
    kept = dataclasses.replace(row)
    world.steal("y_0000")  # term 2, seen by b only
    b.on_watch(world.state.record())
    world.state.row = dataclasses.replace(kept, version=world.state.next_version())
    b.on_watch(world.state.record())  # the store went back to a's grant: a loss to b
    await a.release(successor="b_0000", handed="7")
    handed = world.state.record()
    assert handed is not None
    assert (handed.holder, handed.term) == ("b_0000", 2)
    b.on_watch(handed)
    loss_seen = world.clock.now()
    delay = await b.step()
    assert not b.status().leader
    assert store_of(b).calls["acquire"] == 0
    assert loss_seen + delay >= loss_seen + TIMING.lease_duration
    world.clock.advance(delay)
    await b.step()
    assert b.status().leader
    assert b.status().term > 2 + LOSS_TERM_GAP
    assert store_of(b).calls["acquire"] == 1


async def test_a_handed_term_the_successor_saw_released_is_a_loss(world: World) -> None:
    """Rules 5 and 8: the successor saw y's release of term 2 (not its grant); the store then
    went back to a's grant of term 1, and a, which never saw term 2, hands over with term 2
    again. A grant of a released term is a grant the store forgot made again (y's, or one after
    it b never saw): waited out a lease, then a grant of b's own, its term jumped."""
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire", "read"}, beats={"7": world.clock.now()})
    await a.step()
    row = world.state.row
    assert row is not None
    kept = dataclasses.replace(row)
    world.steal("y_0000")  # term 2, unseen by b
    await MemoryLeaseStore(world.state).release("y_0000", 2)
    b.on_watch(world.state.record())  # b sees y's release of term 2
    world.state.row = dataclasses.replace(kept, version=world.state.next_version())
    b.on_watch(world.state.record())
    await a.release(successor="b_0000", handed="7")
    handed = world.state.record()
    assert handed is not None
    assert (handed.holder, handed.term) == ("b_0000", 2)
    b.on_watch(handed)
    delay = await b.step()
    assert not b.status().leader
    assert store_of(b).calls["acquire"] == 0
    assert delay >= TIMING.lease_duration
    world.clock.advance(delay)
    await b.step()
    assert b.status().leader
    assert b.status().term > 2 + LOSS_TERM_GAP
    assert store_of(b).calls["acquire"] == 1


async def test_a_grant_handed_back_during_the_stand_back_is_taken_at_once(world: World) -> None:
    """Rule 7's stand-back after a voluntary release is for leases free to anyone; one handed
    to us is ours, and the others wait for us. Here the successor cannot lead on the
    hand-over itself (a version it no longer remembers), so it takes it with a write, now."""
    b = world.elector("b", beats={"7": world.clock.now()})
    a = world.elector("a")
    await b.step()
    assert await b.release()  # b stands back one lease
    a.on_watch(world.state.record())
    await a.step()
    assert a.status().leader
    world.clock.advance(1.0)
    assert await a.release(successor="b_0000", handed="8")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader
    assert store_of(b).calls["acquire"] == 2


async def test_a_handed_grant_we_stepped_down_from_is_not_led_on_again(world: World) -> None:
    """b led on a grant handed to it and released it; the store applied the release, but its
    answer never came, so b's view still shows the grant in b's name. c takes the free lease;
    b must not lead on the handed grant again (nor take it back in its stand-back)."""
    a = world.elector("a")
    b = world.elector("b", beats={"7": world.clock.now()})
    c = world.elector("c")
    await a.step()
    assert await a.release(successor="b_0000", handed="7")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader  # on the hand-over, before its first renewal

    def answer_lost() -> None:
        raise StoreUnavailable("release timed out after 1.000s")

    store_of(b).during["release"] = answer_lost  # applied at the store, the answer lost
    world.clock.advance(0.2)
    assert await b.release()
    del store_of(b).during["release"]
    record = world.state.record()
    assert record is not None
    assert record.free
    c.on_watch(record)
    await c.step()
    assert c.status().leader
    for _ in range(3):
        await b.step()
        assert not b.status().leader


async def test_a_handed_grant_is_not_led_on_again_after_a_release_that_never_finished(
    world: World,
) -> None:
    """The same with the release cancelled on its way (the API client that asked for it
    went away): nothing failed, so nothing says "look first"; the grant shown in b's name is
    one b led on and stepped down from."""
    a = world.elector("a")
    b = world.elector("b", beats={"7": world.clock.now()})
    c = world.elector("c")
    await a.step()
    assert await a.release(successor="b_0000", handed="7")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader

    def cancelled() -> None:
        raise asyncio.CancelledError

    store_of(b).during["release"] = cancelled
    with pytest.raises(asyncio.CancelledError):
        await b.release()
    del store_of(b).during["release"]
    record = world.state.record()
    assert record is not None
    c.on_watch(record)
    await c.step()
    assert c.status().leader
    await b.step()
    assert not b.status().leader


async def test_a_handed_grant_at_the_term_of_a_loss_marker_is_a_loss(world: World) -> None:
    """Rules 5 and 8: b saw only a loss marker of term 2 (another replica saw x's grant of
    term 2 forgotten); the store then went back to a's grant of term 1, and a hands over with
    term 2. x may still lead under term 2: b waits the loss out and jumps its term."""
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire", "read"}, beats={"7": world.clock.now()})
    await a.step()
    row = world.state.row
    assert row is not None
    kept = dataclasses.replace(row)
    b.on_watch(LeaseRecord(holder=None, term=2, duration=TIMING.lease_duration, version="mk"))
    world.state.row = dataclasses.replace(kept, version=world.state.next_version())
    b.on_watch(world.state.record())
    await a.release(successor="b_0000", handed="7")
    handed = world.state.record()
    assert handed is not None
    assert (handed.holder, handed.term) == ("b_0000", 2)
    b.on_watch(handed)
    delay = await b.step()
    assert not b.status().leader
    assert delay >= TIMING.lease_duration
    world.clock.advance(delay)
    await b.step()
    assert b.status().term > 2 + LOSS_TERM_GAP


async def test_a_release_naming_us_during_the_stand_back_is_taken_at_once(world: World) -> None:
    """The same where the store cannot hand over (Redis with WAIT or Sentinels): the release
    names the successor, which takes the lease at once despite its stand-back."""
    b = world.elector("b")
    a = world.elector("a", allowed={"acquire", "release"})
    store_of(a).hands_over_here = False
    await b.step()
    assert await b.release()  # b stands back one lease
    a.on_watch(world.state.record())
    await a.step()
    world.clock.advance(1.0)
    assert await a.release(successor="b_0000", handed="7")
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader
    assert b.status().term == 3


async def test_a_handed_grant_too_short_for_a_first_renewal_is_taken_with_a_write(
    world: World,
) -> None:
    """Leading on a beat that leaves less than a request timeout would end at the deadline
    of a renewal that had no time to answer."""
    a = world.elector("a")
    b = world.elector("b", allowed={"acquire"}, beats={"7": world.clock.now()})
    await a.step()
    world.clock.advance(TIMING.renew_interval)
    await a.step()
    world.clock.advance(TIMING.lease_duration - MARGIN - TIMING.renew_interval - 0.5)
    await a.step()
    assert a.status().leader
    await a.release(successor="b_0000", handed="7")  # b's beat leaves it 0.5 s < 1 s
    b.on_watch(world.state.record())
    await b.step()
    assert b.status().leader
    assert b.status().term == 3
    assert store_of(b).calls == {"acquire": 1}


async def test_a_leader_hands_over_only_where_the_store_can(world: World) -> None:
    a = world.elector("a", allowed={"acquire", "release"})
    store_of(a).hands_over_here = False
    await a.step()
    await a.release(successor="b_0000", handed="7")
    record = world.state.record()
    assert record is not None
    assert (record.free, record.successor) == (True, "b_0000")


async def test_a_replica_shutting_down_gives_back_a_grant_handed_to_it(world: World) -> None:
    """The leader chose it a moment before it could know this replica was leaving: released
    at once, so the others need not wait it out."""
    a = world.elector("a")
    b = world.elector("b", allowed={"release"}, beats={"7": world.clock.now()})
    await a.step()
    await a.release(successor="b_0000", handed="7")
    b.on_watch(world.state.record())
    b.stop()
    assert not await b.release("shutdown")
    record = world.state.record()
    assert record is not None
    assert record.free
    assert store_of(b).calls == {"release": 1}


# -- the watch ---------------------------------------------------------------------------------


async def test_a_release_seen_on_the_watch_makes_a_follower_try_at_once(world: World) -> None:
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    assert b._next_attempt > world.clock.now() + 5
    record = await a.store.release("a_0000", 1)
    b.on_watch(record)
    assert b._next_attempt - world.clock.now() <= 0.05


async def test_a_leader_that_sees_a_newer_grant_on_the_watch_steps_down(world: World) -> None:
    a = world.elector("a")
    await a.step()
    world.steal("x_9999")
    a.on_watch(world.state.record())
    assert not a.status().leader
    assert demotions(a, "lost") == 1


# -- notifications -----------------------------------------------------------------------------


async def test_listeners_hear_every_transition_in_order(world: World) -> None:
    a = world.elector("a")
    heard: list[Transition] = []
    a.on_transition(heard.append)
    await a.step()
    await a.release()
    assert [(t.role, t.reason) for t in heard] == [
        (Role.LEADER, "acquired"),
        (Role.FOLLOWER, "released"),
    ]
    assert heard[0].status.leader
    assert not heard[1].status.leader


async def test_a_long_poll_returns_as_soon_as_the_state_changes(world: World) -> None:
    """Through the listeners' change feed, as ``GET /leader?wait=`` waits."""
    a = world.elector("a")
    feed = ChangeFeed(LeaseSet.single(a))
    following = asyncio.create_task(feed.follow())
    try:
        etag = a.status().etag
        waiter = asyncio.create_task(feed.wait(a.status, lambda s: s.etag, etag, 5.0))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await a.step()
        status = await asyncio.wait_for(waiter, timeout=1)
        assert status.leader
        assert status.etag != etag
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_renewal_hanging_past_half_the_lease_alerts_while_still_in_flight() -> None:
    """With a long request timeout the renewal is still out at the half-lease mark: the
    growing-gap alert fires then, not when the request finally fails."""
    timing = Timing(lease_duration=2.0, renew_interval=0.5, retry_period=0.2, request_timeout=0.9)
    state = MemoryLeaseState()
    store = StrictStore(state)
    elector = Elector(
        store,
        timing,
        "a_0000",
        "unit",
        metrics=Metrics(CollectorRegistry(), "unit", timing.lease_duration),
    )
    await elector.step()
    hang = asyncio.Event()
    alerts: list[float] = []
    elector.on_gap_alert(lambda alert: alerts.append(elector._clock.now()))

    async def hanging_renew(*args: object) -> LeaseRecord:
        await hang.wait()
        raise AssertionError("unreachable")

    store.renew = hanging_renew  # type: ignore[method-assign, assignment]
    await asyncio.sleep(timing.renew_interval)
    half_mark = elector._gaps.half_mark
    renewing = asyncio.create_task(elector.step())
    await asyncio.sleep(half_mark - elector._clock.now() + 0.05)
    assert not renewing.done(), "the renewal should still be in flight"
    assert len(alerts) == 1
    await renewing
    assert len(alerts) == 1


async def test_the_new_leader_names_the_previous_holder_even_after_a_release(
    world: World,
) -> None:
    """The demotion actions relabel the previous holder's pod: it must be named even when the
    last record seen was the released (holder-less) one."""
    a, b = world.elector("a"), world.elector("b")
    heard: list[Transition] = []
    b.on_transition(heard.append)
    await a.step()
    await b.step()
    b.on_watch(await a.store.release("a_0000", 1))
    await b.step()
    assert b.status().leader
    assert heard[-1].previous_holder == "a_0000"


async def test_a_leader_that_takes_its_own_lease_back_names_itself_as_the_previous_holder(
    world: World,
) -> None:
    """Demoted at its deadline while the store refused, then the lease taken back under a new
    term: the grant replaced was its own, not that of the last other replica it ever saw."""
    a = world.elector("a")
    (store,) = world.stores
    heard: list[Transition] = []
    a.on_transition(heard.append)
    await a.step()
    world.steal("b_0000")
    world.clock.advance(TIMING.renew_interval)
    await a.step()  # the renewal finds b's grant
    assert not a.status().leader
    world.clock.advance(TIMING.lease_duration + 1.0)
    await a.step()
    assert a.status().leader
    assert heard[-1].previous_holder == "b_0000"
    store.fail_always("renew", StoreUnavailable("timed out"))
    store.fail_always("acquire", StoreUnavailable("timed out"))
    for _ in range(20):
        world.clock.advance(TIMING.retry_period)
        await a.step()
    assert not a.status().leader
    store.heal()
    world.clock.advance(TIMING.lease_duration + 1.0)
    await a.step()
    assert a.status().leader
    assert heard[-1].previous_holder == "a_0000"


async def test_a_successor_handed_the_lease_names_the_leader_that_handed_it(world: World) -> None:
    """A hand-over writes the successor's grant itself: the successor sees its own name before
    it leads (here it takes it again by a write, remembering no beat), and the grant replaced
    is still the old leader's."""
    a, b = world.elector("a"), world.elector("b")
    heard: list[Transition] = []
    b.on_transition(heard.append)
    await a.step()
    await b.step()
    world.steal("b_0000")  # the old leader's one write: term 2, in b's name
    handed = await b.store.read()
    assert handed is not None
    b.on_watch(handed)
    for _ in range(10):
        if b.status().leader:
            break
        world.clock.advance(TIMING.retry_period)
        await b.step()
    assert b.status().leader
    assert heard[-1].previous_holder == "a_0000"


# -- the half-lease alert also covers the gap that ends in a demotion --------------------------


@pytest.mark.parametrize("wakes_in", ["tick", "step"])
async def test_a_gap_that_ends_in_a_deadline_demotion_is_alerted(
    world: World, wakes_in: str
) -> None:
    """A stall (a blocked loop, SIGSTOP, a long GC) that wakes up past the deadline: the gap is
    counted and alerted first, then the leader demotes — the very gap the alert exists for."""
    a = world.elector("a")
    alerts = []
    a.on_gap_alert(alerts.append)
    await a.step()
    world.clock.advance(TIMING.lease_duration)  # woke up past the deadline in one go
    if wakes_in == "tick":
        a.tick(world.clock.now())
    else:
        await a.step()
    assert demotions(a, "deadline") == 1
    assert sample(a, "leader_sidecar_renewal_gap_over_half_lease_total") == 1
    assert len(alerts) == 1
    assert alerts[0].gap >= TIMING.lease_duration


async def test_stop_ends_the_loop_without_a_cancel(world: World) -> None:
    """Shutdown must not depend on a cancellation arriving intact: one that lands as a
    request's own timeout fires surfaces as that timeout, which the loop tolerates."""
    a = world.elector("a")
    running = asyncio.create_task(run_alone(a))
    await asyncio.sleep(0.05)
    assert a.status().leader
    a.stop()
    await asyncio.wait_for(running, timeout=2.0)  # returns by itself: no cancel() sent
    assert running.done()
    assert not running.cancelled()


# -- issue 25: records that cannot be read, and the term's bound -------------------------------


def hand_edit(world: World, **fields: object) -> None:
    """What a hand edit of the store does: fields changed, the version left as it was."""
    row = world.state.row
    assert row is not None
    for name, value in fields.items():
        setattr(row, name, value)
    world.state.notify()


def bad_records(elector: Elector) -> float | None:
    return elector.metrics.registry.get_sample_value(
        "leader_sidecar_bad_records_total", {"kind": "lease"}
    )


async def test_a_lease_record_that_cannot_be_read_is_waited_out_then_taken_over_with_a_jump(
    world: World,
) -> None:
    """A term of 2^63 - 1 (issue 25: every grant after it overflowed, and every sidecar kept
    it as the highest term seen): the record is one of unknown holder. Its holder cannot prove
    the grant and demotes; the others wait a lease from when they saw it, then take it over
    its version with a term above every term seen, which the store can hold."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    hand_edit(world, term=2**63 - 1)
    seen = world.clock.now()
    record = world.state.record()
    assert record is not None
    assert record.unreadable is not None
    b.on_watch(record)
    a.on_watch(record)  # the leader renews at once: the store no longer shows its term
    assert a.status().leader
    await a.step()
    assert not a.status().leader
    assert demotions(a, "lost") == 1
    assert b.status().term == 1  # not the term it cannot read
    while world.clock.now() + 0.5 < seen + TIMING.lease_duration:
        world.clock.advance(0.5)
        await b.step()
        assert not b.status().leader
    world.clock.advance(1.0)
    await b.step()
    assert b.status().leader
    assert b.status().term == 1 + LOSS_TERM_GAP + 1
    assert bad_records(a) == bad_records(b) == 1  # each counted it once, however often seen


async def test_a_leader_keeps_its_lease_through_a_timestamp_nobody_can_read(world: World) -> None:
    """A timestamp is for humans: one that cannot be parsed is reported, not a fail-over."""
    a, b = world.elector("a"), world.elector("b")
    await a.step()
    await b.step()
    hand_edit(world, renewed_at="garbage")
    record = world.state.record()
    assert record is not None
    assert (record.unreadable, record.holder) == (None, "a_0000")
    b.on_watch(record)
    a.on_watch(record)
    world.clock.advance(TIMING.renew_interval)
    await a.step()
    assert a.status().leader
    assert b.view.loss_since is None
    assert bad_records(b) == 1


async def test_a_leader_renews_through_a_record_it_cannot_read_while_the_store_holds_its_grant(
    world: World,
) -> None:
    """The watch shows a record it cannot read, but the store still holds the leader's holder
    and term (here, a successor on a held record was garbled): the renewal at once settles it,
    conditionally, and the leader never stops."""
    a = world.elector("a")
    await a.step()
    hand_edit(world, handed=b"\xff")
    record = world.state.record()
    assert record is not None
    assert record.unreadable is not None
    a.on_watch(record)
    await a.step()
    assert a.status().leader
    assert store_of(a).calls["renew"] == 1
    assert demotions(a, "lost") is None or demotions(a, "lost") == 0


async def test_no_grant_passes_the_highest_term_the_store_holds(world: World) -> None:
    """At the store's bound the grant is refused, with a reason that says what to do; the
    elector keeps trying (never a crash) and never leads on a term it could not write."""
    b = world.elector("b")
    world.state.row = _Row(None, MAX_TERM, 10.0, world.state.next_version(), True, None, None)
    await b.step()
    assert not b.status().leader
    assert b.last_error is not None
    assert "refusing to grant term" in b.last_error
    assert sample(b, "leader_sidecar_store_requests_total", op="acquire", outcome="unavailable")
    world.clock.advance(TIMING.retry_period * 2)
    await b.step()  # still refused, still running
    assert not b.status().leader
