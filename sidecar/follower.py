"""A follower's writes at its step (steps 3 and 4 of `Elector.step`): taking a lease that is
free or expired, with a term above every term seen (rules 1, 2, 3 and 5); leading on a grant a
hand-over wrote to it without a write of its own; and writing a store's loss down (a loss
marker, rule 5), a conditional write that never grants. Each returns the delay until the
next step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sidecar.backends.base import Conflict, LeaseHeld, LeaseRecord, StoreError
from sidecar.clock import Clock
from sidecar.lease_handle import LeaseHandle
from sidecar.logs import log
from sidecar.observed import Attempt

logger = logging.getLogger("sidecar.elector")  # the elector's lines: operators filter on it


class Following(LeaseHandle, Protocol):
    """What a follower's writes need of their lease (`sidecar.elector.Elector`)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def hold_off_until(self) -> float:
        """Until when to stand back after a voluntary release (rule 7)."""
        ...

    @property
    def gate(self) -> Callable[[Any, Attempt], float] | None:
        """How long to wait before taking one more lease (0: go): the balancer's share and
        whose turn it is. Liveness only: a wait delays an attempt, it never grants anything."""
        ...

    @property
    def acquire_slots(self) -> contextlib.AbstractAsyncContextManager[Any] | None:
        """Shared by the leases of a sidecar: at most so many acquires in flight."""
        ...

    @property
    def beat_sent_at(self) -> Callable[[str], float | None] | None:
        """When this replica sent the candidate beat of a version (None: not ours)."""
        ...

    def become_leader(
        self, record: LeaseRecord, sent: float, *, valid_until: float | None = None, how: str = ...
    ) -> None: ...

    def follower_delay(self, *, raced: bool = False) -> float: ...

    def retry_delay(self) -> float: ...


async def acquire(lease: Following, sent: float, *, second_try: bool = False) -> float:
    """Step 3: take the lease if the view allows, naming the version it watched."""
    view = lease.view
    store = lease.store
    timing = lease.timing
    if view.blind:
        # A request failed since we last saw the store: look before taking anything, so
        # a loss we could not see (the store restarted meanwhile) is waited out on its own.
        try:
            record = await lease.request("read", store.read, timing.request_timeout)
        except StoreError:
            view.lost_sight()
            return lease.retry_delay()
        lease.observe(record)
        return lease.follower_delay()
    attempt = view.next_attempt(sent)
    handed_to_us = attempt.why == "own" and handed_to(lease)
    if handed_to_us:
        first_renewal = _take_handed(lease, sent)
        if first_renewal is not None:
            return first_renewal
    if sent < lease.hold_off_until and attempt.why != "handed" and not handed_to_us:
        # Rule 7: after a voluntary release, stand back for one lease — unless the lease
        # was handed to us by name since (a transfer back; the others wait for us then).
        return lease.hold_off_until - sent
    if attempt.at > sent:  # not yet expired, or a store loss not yet waited out
        return attempt.at - sent
    try:
        async with lease.acquire_slots or contextlib.nullcontext():
            # Asked holding the slot, so that the acquires in flight count as taken.
            gate = lease.gate
            if gate is not None and attempt.why not in ("own", "handed"):
                wait = gate(lease, attempt)  # over our share, or another's turn
                if wait > 0:
                    return wait
            # Rule 3 counts a grant from when its request is sent: now, not when this step
            # began. At start-up an acquire may wait seconds for a slot, and a grant timed
            # from before that wait came with its deadline spent (the start-up
            # losses at the holder's own deadline).
            sent = lease.clock.now()
            record = await lease.request(
                "acquire",
                lambda: store.try_acquire(
                    lease.identity,
                    timing.lease_duration,
                    attempt.min_term,
                    expected=attempt.expected,
                ),
                timing.request_timeout,
            )
    except (LeaseHeld, Conflict) as refused:
        # The store holds something else than what we named: observe it and decide anew.
        lease.observe(refused.record)
        now = lease.clock.now()
        due = view.next_attempt(now).at <= now
        if due and not second_try and isinstance(refused, LeaseHeld):
            # Released (or ours) since we last looked, e.g. before the watch told us:
            # take it now rather than one scheduling round later.
            return await acquire(lease, now, second_try=True)
        return lease.follower_delay(raced=isinstance(refused, Conflict))
    except StoreError:
        view.lost_sight()
        return lease.retry_delay()
    if record.holder != lease.identity or record.term <= attempt.min_term:
        # A store that broke its contract: leading on a reused term would break fencing.
        log(
            logger,
            "error",
            "store granted a term that is not above every term seen; refusing to lead",
            granted_term=record.term,
            highest_seen=attempt.min_term,
            store=store.description,
        )
        lease.observe(record)
        return lease.retry_delay()
    if attempt.why == "lost":
        log(
            logger,
            "warning",
            "took the lease after waiting out the store's loss of state; the term jumps "
            "so it cannot repeat a grant the store forgot",
            lease=lease.lease,
            term=record.term,
            highest_term_seen=view.high_water,
            losses_in_a_row=view.losses_in_a_row,
        )
    lease.become_leader(record, sent)
    return max(0.0, sent + timing.renew_interval - lease.clock.now())


def _take_handed(lease: Following, now: float) -> float | None:
    """Lead on a grant a hand-over wrote in our name, without a write of our own. Its
    lease counts from when we sent the candidate beat it names (rule 3: a moment before
    the grant was written; the others time the grant from when they see it, later still).
    Returns the delay until the first renewal, or None when the record must be taken like
    any record in our name (a write under a new term): not handed by a beat we remember, or
    too old a beat to leave a first renewal its request timeout. A term not above every
    term we saw before it is a loss (rule 5, `LeaseView`), and a loss not yet waited out
    never gets here (`LeaseView.next_attempt`)."""
    record = lease.view.record
    beat_sent_at = lease.beat_sent_at
    if beat_sent_at is None or record is None or not handed_to(lease):
        return None
    assert record.handed is not None  # (`handed_to`)
    beat_sent = beat_sent_at(record.handed)
    if beat_sent is None:
        return None
    timing = lease.timing
    length = min(record.duration, timing.lease_duration)
    valid_until = beat_sent + length - timing.safety_margin
    if valid_until - now < timing.request_timeout:
        return None
    lease.become_leader(record, now, valid_until=valid_until, how="handed")
    # Renew on our usual beat from the candidate beat, at once if that is past: the next
    # renewal restores a full lease.
    return max(0.0, beat_sent + timing.renew_interval - lease.clock.now())


def handed_to(lease: Following) -> bool:
    """The record is a grant a hand-over wrote to us, which we never led on: not one we
    led on and stepped down from (a release of it that failed, or is still on its way,
    leaves it shown in our name; leading on it again could lead beside the next holder)."""
    record = lease.view.record
    return (
        record is not None
        and record.holder == lease.identity
        and record.handed is not None
        and record.term != lease.term
    )


async def write_loss_down(lease: Following, seen: int) -> float:
    """Step 4: mark the loss in the store; a conditional write that never grants, so no wait
    or share applies (the acquire slots do: at a store restart, every lease is marked)."""
    store = lease.store
    timing = lease.timing
    try:
        async with lease.acquire_slots or contextlib.nullcontext():
            record = await lease.request(
                "mark_lost",
                lambda: store.mark_lost(seen, timing.lease_duration),
                timing.request_timeout,
            )
    except StoreError:
        lease.view.lost_sight()
        return lease.retry_delay()
    lease.observe(record)
    if record is not None and record.forgotten and record.term == seen:
        log(
            logger,
            "info",
            "wrote the store's loss down (a loss marker with the highest term seen), so a "
            "replica that starts now waits it out and jumps its term too",
            lease=lease.lease,
            term=seen,
        )
    return lease.retry_delay() if record is None else lease.follower_delay()
