"""The elector: one replica's follower/leader state machine over a `LeaseStore`.

It imports only the backend interface. The safety rules of docs/design.md live here as follows:

* Rule 3 — `valid_until` is the monotonic time at which the last successful acquire/renew was
  *sent*, plus the lease, minus a safety margin. Passing it demotes, whatever the store says
  (`_past_deadline`, the one place). Every renewal, alone or in a batch, takes the one path of
  `sidecar.renewal`, which times it from its sending.
  A grant a hand-over wrote to us counts from when we sent the candidate beat the releasing
  holder chose us by: that beat was read before the hand-over was written, so the moment is
  before the write, as a renewal's sending is (`sidecar.follower`).
* Rule 4 — `status()` compares the clock with `valid_until` on every call; no cached flag.
* Rules 2, 5 and 8 — `sidecar.observed.LeaseView` decides when a follower may try to
  acquire, naming the version it watched unchanged for a lease (observed expiry, the same for
  every store), and with which term floor (above every term seen; far above after a store
  lost state, which is waited out a full lease each time).
* Rule 5 — a leader stops at once when it sees a grant to another identity at a term at or
  above its own; when it sees the store lost its grant, it renews at once, which puts the
  grant back (the store's `renew` restores a forgotten grant).
* Rule 7 — `release()` demotes locally first, then releases conditionally (`sidecar.release`).

Rule 1 is the store's (see `sidecar.backends.base`); rule 6 is the identity's suffix (see
`sidecar.config`).

Here are the state and its changes; the requests that drive them live beside it, each reaching
the elector through a Protocol of its own: a follower's writes in `sidecar.follower`, the
renewal in `sidecar.renewal`, stepping down in `sidecar.release`. How long to wait between
steps is `sidecar.pacing`; a leader's renewal gaps and their alert, `sidecar.renewal_gaps`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sidecar import pacing
from sidecar.backends.base import (
    Conflict,
    FollowsByCall,
    LeaseRecord,
    LeaseStore,
    NotOwned,
    RenewsEach,
    StoreError,
    StoreUnavailable,
    is_hold,
    lost_grant,
)
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.follower import acquire, write_loss_down
from sidecar.logs import log
from sidecar.metrics import Metrics
from sidecar.observed import Attempt, LeaseView
from sidecar.probe import StoreProbe
from sidecar.release import give_back, step_down
from sidecar.renewal import renew_held
from sidecar.renewal_gaps import RenewalGaps
from sidecar.status import GapAlert, LeaderStatus, Role, Transition
from sidecar.store_call import ANSWERS, store_call
from sidecar.supervisor import Supervisor
from sidecar.timing import Timing

T = TypeVar("T")
logger = logging.getLogger("sidecar.elector")


def _taken_by(record: LeaseRecord | None) -> str:
    """The demotion reason when the store shows the lease is no longer ours: an operator's
    hold (`leader-sidecar hold`), or lost."""
    return "hold" if record is not None and is_hold(record.holder) else "lost"


def no_scheduler(elector: Elector) -> None:
    """`Elector.wake_scheduler` while no scheduler runs the elector: nobody to tell."""


def _own_name(elector: Elector) -> str:
    return elector.lease


class Elector:
    # A sidecar may run 10,000 electors: without slots each carried a ~1.7 KB instance dict
    # (past 30 attributes CPython stops sharing the keys). ``__dict__`` stays, empty unless
    # something sets an attribute not listed here (a test patching a method).
    __slots__ = (
        "__dict__",
        "_change_listeners",
        "_clock",
        "_gaps",
        "_last_error",
        "_last_status",
        "_last_store_answer",
        "_lock",
        "_muted",
        "_next_attempt",
        "_on_beat",
        "_probe",
        "_published",
        "_renewal_out",
        "_reported_version",
        "_retry_not_before",
        "_rng",
        "_role",
        "_role_since",
        "_stopping",
        "_supervisor",
        "_term",
        "_transition_listeners",
        "_valid_until",
        "_view",
        "_watch_asked",
        "acquire_slots",
        "beat_sent_at",
        "gate",
        "hold_off_until",
        "identity",
        "lease",
        "metrics",
        "store",
        "timing",
        "wake_scheduler",
    )

    def __init__(
        self,
        store: LeaseStore,
        timing: Timing,
        identity: str,
        lease: str,
        *,
        metrics: Metrics,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        stand_back: float = 0.0,
        gate: Callable[[Elector, Attempt], float] | None = None,
        acquire_slots: contextlib.AbstractAsyncContextManager[Any] | None = None,
        beat_sent_at: Callable[[str], float | None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.store = store
        self.timing = timing
        self.identity = identity
        self.lease = lease
        self.metrics = metrics
        self._clock = clock
        self._rng = rng or random.Random()

        self._role = Role.FOLLOWER
        self._term = 0  # term of our own grant while leading
        self._valid_until = float("-inf")
        self._view = LeaseView(identity, timing.lease_duration, stand_back)  # rules 2, 5 and 8
        # How long this replica should wait before taking one more lease (0: go): the
        # balancer's share and whose turn it is. Asked only for a lease that is free
        # or expired; never for our own or one handed to us. Liveness only: a wait delays an
        # attempt, it never grants anything.
        self.gate = gate
        # Shared by the electors of one sidecar: at most so many acquires in flight, so that
        # 1,000 leases up for grabs at start-up never queue a renewal behind them at the store.
        self.acquire_slots = acquire_slots
        # When this replica sent the candidate beat of a version (None: not one of ours, or
        # forgotten): what a grant handed to us by that version counts from. None: no beat,
        # so a grant handed to us is taken back with a write, like any record in our name.
        self.beat_sent_at = beat_sent_at
        self._supervisor = supervisor or Supervisor()  # restarts the watch follower
        # Shared by every lease of a sidecar: while the store refuses, a follower waits for it
        # instead of sending requests of its own (`sidecar.probe`). None: no waiting (tests).
        self._probe: StoreProbe | None = None
        self._role_since = clock.wall()
        self._next_attempt = clock.now()
        self.hold_off_until = float("-inf")  # `stand_back`: after a voluntary release (rule 7)
        self._gaps = RenewalGaps(self)
        self._last_error: str | None = None
        # When the renewal now in flight was sent (alone or in a batch): a gap alert raised
        # while it is out says so instead of "no error" (the store has not answered yet).
        self._renewal_out: float | None = None
        # A failed renewal's Retry-After, as a monotonic moment: the store's answering another
        # request (`store_answers`) does not bring a retry before it.
        self._retry_not_before = float("-inf")
        self._last_store_answer = float("-inf")
        self._reported_version: str | None = None  # the last bad record logged and counted

        self._watch_asked = float("inf")  # earliest attempt the watch asked for during a step
        self._lock = asyncio.Lock()  # one store mutation at a time
        # Tells the scheduler this elector runs on (`sidecar.schedule`) that it may be due
        # sooner than it was: a watch event, a poke, a stop.
        self.wake_scheduler: Callable[[Elector], None] = no_scheduler
        # True while the next attempt is a leader's renewal on its usual beat (after a grant or
        # a renewal), not a retry: only such a renewal may go early to join a batch (a retry
        # may be waiting for the store's Retry-After).
        self._on_beat = False
        self._published: tuple[bool, str | None, int] | None = None  # `_shown` when published
        # Tuples, the empty one shared: a list each cost ~90 bytes more per elector.
        self._transition_listeners: tuple[Callable[[Transition], None], ...] = ()
        self._change_listeners: tuple[Callable[[Elector], None], ...] = ()
        self._stopping = False  # set by `stop`: no new step starts, whatever a cancel turned into
        self._muted = False  # `mute`: draining, answer 503 while the lease is still held
        # The last `status` built: an app polling hard asks many times a millisecond, and
        # the answer changes at most once a millisecond (``valid_for`` is in milliseconds).
        self._last_status: LeaderStatus | None = None
        metrics.bind(self)

    # -- what the API reads -------------------------------------------------------------

    def is_leader(self) -> bool:
        """Rule 4: judged now, against the deadline, never from a cached flag."""
        return self._role is Role.LEADER and self._clock.now() < self._valid_until

    def _shown(self, now: float) -> tuple[bool, str | None, int]:
        """What the ETag is made of: leading now, the holder, the term."""
        if self._role is Role.LEADER:
            return now < self._valid_until and not self._muted, self.identity, self._term
        observed = self._view.record
        holder = observed.holder if observed else None
        known = observed is not None and observed.unreadable is None
        term = observed.term if observed is not None and known else self._view.high_water
        return False, holder, term

    def shown(self) -> tuple[tuple[bool, str | None, int], float]:
        """What the ETag is made of now (leading, holder, term), and for how long this replica
        still leads (0 when it does not): `status` without building it, for a change feed that
        may look at 10,000 leases at once (when it starts)."""
        now = self._clock.now()
        shown = self._shown(now)
        published = self._published
        if shown == published:
            shown = published  # the feeds keep this one, not a copy each (10,000 leases)
        return shown, max(0.0, self._valid_until - now) if shown[0] else 0.0

    def status(self) -> LeaderStatus:
        now = self._clock.now()
        leading, holder, term = self._shown(now)
        valid_for = round(max(0.0, self._valid_until - now), 3) if leading else 0.0
        starting = not leading and not self._view.seen_anything
        last = self._last_status
        if (
            last is not None
            and last.valid_for == valid_for
            and last.leader is leading
            and last.term == term
            and last.holder == holder
            and last.since is self._role_since
            and last.starting is starting
        ):
            return last
        self._last_status = status = LeaderStatus(
            leader=leading,
            identity=self.identity,
            holder=holder,
            term=term,
            lease=self.lease,
            lease_duration=self.timing.lease_duration,
            valid_for=valid_for,
            since=self._role_since,
            starting=starting,
        )
        return status

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        """The term of our own grant while leading (the last one led on, after)."""
        return self._term

    @property
    def high_water(self) -> int:
        return self._view.high_water

    @property
    def view(self) -> LeaseView:
        return self._view

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def renewal_out(self) -> float | None:
        """When the renewal now in flight was sent; None while none is."""
        return self._renewal_out

    def store_answered_within(self, seconds: float) -> bool:
        """For ``/readyz``: did the store answer (any answer) recently?"""
        return self._clock.now() - self._last_store_answer <= seconds

    def on_transition(self, listener: Callable[[Transition], None]) -> None:
        """``listener`` is called synchronously on every role change; it must not block."""
        self._transition_listeners = (*self._transition_listeners, listener)

    def on_gap_alert(self, listener: Callable[[GapAlert], None]) -> None:
        self._gaps.on_alert(listener)

    def on_change(self, listener: Callable[[Elector], None]) -> None:
        """``listener(elector)`` is called (on the election's thread) whenever the ETag
        changes; it must be thread-safe and must not block (e.g.
        ``loop.call_soon_threadsafe``). A leader passing its deadline with no election
        activity is not reported: readers time that from ``status().valid_for`` themselves."""
        self._change_listeners = (*self._change_listeners, listener)

    def poke(self) -> None:
        """Try again now if following (the balancer's share grew, a candidate appeared, the
        store answers again) — or, for a lease another replica holds, at its observed expiry
        if that is sooner than the next attempt planned. A step now would only find that out
        again: every beat pokes every follower, and a thousand steps each beat were a good
        part of a sidecar's CPU."""
        if self._role is Role.LEADER or self._stopping:
            return
        now = self._clock.now()
        if self._view.blind or self._loss_to_write_down() is not None:
            at = now
        else:
            at = max(now, self._view.next_attempt(now).at)
        if at < self._next_attempt:
            self._ask_for_attempt(at)

    def mute(self) -> None:
        """From now on ``/leader`` answers 503 while this replica still holds (and renews) the
        lease: a drain on SIGTERM, where the app must stop before the lease may move
        (`LeaseSet.drain`). Only stopping leads here; nothing unmutes."""
        self._muted = True
        self._publish()

    def store_answers(self) -> None:
        """The store answered another request — the sidecar's probe, a watch that resumed
        after a reconnection: a leader whose renewal failed renews now, not a retry period
        later, so that a deadline still ahead keeps its term (a PostgreSQL failover answered
        0.8 s before the deadline and the leader demoted at it, then took its lease back under
        a new term). Never before a ``Retry-After`` the store gave, nor beside a renewal in
        flight."""
        if self._role is not Role.LEADER or self._on_beat or self._stopping:
            return
        now = self._clock.now()
        if self._renewal_out is None and now >= self._retry_not_before and now < self._next_attempt:
            self._ask_for_attempt(now)

    def use_probe(self, probe: StoreProbe) -> None:
        """Wait for ``probe`` while the store refuses (see `sidecar.probe`); the owner pokes
        this elector when the store is back."""
        self._probe = probe

    # -- the loop -----------------------------------------------------------------------

    def start_watch(self) -> asyncio.Task[None] | Callable[[], None]:
        """Follow the store's watch (restarted by the supervisor if it fails); the scheduler
        starts it and cancels it when it ends. A store that calls a function on each change
        (`FollowsByCall`) is followed without a task: the function returned stops it."""
        if isinstance(self.store, FollowsByCall):
            return self.store.follow(self.on_watch)
        return self._supervisor.spawn("lease-watch", self._follow_watch)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def wake_at(self) -> float:
        """When the scheduler must next look at this elector: its next attempt, or a timer."""
        return min([self._next_attempt, *self._timers()])

    def due(self, now: float) -> bool:
        return now >= self._next_attempt

    def may_renew(self) -> bool:
        """Leading, and nothing else mutating the lease at the store (a release holds the
        lock): a batch may take it now."""
        return self._role is Role.LEADER and not self._lock.locked()

    def renews_by(self, horizon: float) -> bool:
        """Leading, with a renewal on its usual beat due by ``horizon``: it may go now with a
        batch instead (renewing early only moves the next deadline earlier)."""
        return self._role is Role.LEADER and self._on_beat and self._next_attempt <= horizon

    def stop(self) -> None:
        """Start no new step, and tell the scheduler. Shutdown calls this before cancelling:
        a cancellation that lands just as a request's own timeout fires can surface as that
        timeout, which the loop tolerates as a store error and goes on renewing — a sidecar
        that would never finish its SIGTERM."""
        self._stopping = True
        self.wake_scheduler(self)

    def timers(self) -> list[float]:
        """See `_timers`."""
        return self._timers()

    @property
    def probe(self) -> StoreProbe | None:
        return self._probe

    @property
    def lock(self) -> asyncio.Lock:
        """Held by whatever mutates the lease at the store: a step, a batch, a release."""
        return self._lock

    def _timers(self) -> list[float]:
        """Moments the loop must wake for even without a store call: the deadline, and the
        half-lease mark of a renewal gap not yet alerted."""
        if self._role is not Role.LEADER:
            return []
        timers = [self._valid_until]
        if not self._gaps.alerted:
            timers.append(self._gaps.half_mark)
        return timers

    def tick(self, now: float) -> None:
        """Time-driven transitions, no I/O: alert a growing gap, demote at the deadline."""
        self._gaps.check(now)
        self._past_deadline(now)

    def _past_deadline(self, now: float) -> bool:
        """Rule 3, the one place a leader stops on its own clock: past its deadline it has
        stopped leading, whatever the store would say — it may be partitioned from a store
        that already let the lease expire. Asked by its timer (`tick`), before a renewal is
        sent (`begin_renewal`), and when one fails or is confirmed too late. True if it
        demoted now."""
        if self._role is Role.LEADER and now >= self._valid_until:
            self.demote("deadline")
            return True
        return False

    async def step(self) -> float:
        """One acquire-or-renew step. Returns the delay until the next one."""
        async with self._lock:
            self._watch_asked = float("inf")
            leading = self._role is Role.LEADER
            # 1. A leader past its deadline has stopped leading, whatever the store would say
            #    (rule 3); 2. leading, renew, conditional at the store on our holder and term
            #    (rule 1): the one renewal path, as a batch of one (`sidecar.renewal`).
            delay = await self._renew() if leading else None
            # 3. Following: acquire if free or expired, with a term above every term seen —
            #    unless the store refuses: then the sidecar's one probe asks for us
            #    (`sidecar.follower`, as step 4).
            if delay is None:
                now = self._clock.now()
                if (waiting := pacing.probe_wait(self._probe, now)) is not None:
                    return self._park(now, waiting)
                delay = await acquire(self, now)
            # 4. A loss seen, the store holding nothing or a lower term: write it down (rule 5).
            seen = self._loss_to_write_down()
            if seen is not None:
                now = self._clock.now()
                if (waiting := pacing.probe_wait(self._probe, now)) is not None:
                    return self._park(now, waiting)
                delay = await write_loss_down(self, seen)
            # 5. The watch may have seen something while we were busy (a release, our own name,
            #    a lost grant): never wait past the moment it asked for — unless this step made
            #    us leader: then what it saw as a follower was our own grant on its way (a
            #    renewal right after every acquire doubled the writes of a start-up).
            now = self._clock.now()
            if not leading and self._role is Role.LEADER:
                self._watch_asked = float("inf")
            self._next_attempt = min(now + delay, max(now, self._watch_asked))
            return delay

    def _park(self, now: float, wait: float) -> float:
        """Wait for the probe without a request. The probe's owner pokes every elector when
        the store answers again; until then look again once a lease (no request either)."""
        delay = min(wait, self.timing.lease_duration)
        self._next_attempt = min(now + delay, max(now, self._watch_asked))
        return delay

    async def _renew(self) -> float | None:
        """Steps 1 and 2 of `step` for a leader: a batch of one of its own ``renew``, counted
        as this lease's and cut at its deadline. The delay until the next step, or None when
        it demoted at step 1."""
        alarm = self._gaps.alarm()  # a renewal still out at the half-lease mark is alerted
        try:
            done = await renew_held(
                [self],
                RenewsEach(self._own_store),
                _own_name,
                self.metrics.store_request,
                until=self._valid_until,
            )
        finally:
            alarm.cancel()
            self._renewal_out = None
        return done[0][1] if done else None

    def _own_store(self, name: str) -> LeaseStore:
        return self.store

    def _renewal_failed(self, failed: StoreError) -> float:
        """A renewal that did not renew: the delay until the next step."""
        self._on_beat = False
        if isinstance(failed, NotOwned):
            self.observe(failed.record)
            self.demote(_taken_by(failed.record))
            return self.follower_delay()
        # Tolerated only while the deadline is ahead (rule 3): retry before it. A Conflict
        # (another write raced ours; the store re-read a record that is still ours) is
        # retried at once: waiting a retry period could cost the deadline for nothing.
        now = self._clock.now()
        self._gaps.check(now)
        if self._past_deadline(now):
            return self.retry_delay()
        if isinstance(failed, Conflict):
            self.observe(failed.record)
            return min(pacing.herd_jitter(self.timing, self._rng), self._valid_until - now)
        delay, self._retry_not_before = pacing.renewal_retry(
            now, self._valid_until, failed, self.timing, self._rng
        )
        return delay

    def _renewal_answered(self, sent: float, record: LeaseRecord) -> float:
        """A renewal sent at ``sent`` that the store confirmed."""
        if self._past_deadline(self._clock.now()):
            # Confirmed too late: /leader already said 503 at the deadline (rule 4), so stop
            # leading for real; the next step re-acquires under a new term.
            self.observe(record)
            return 0.0
        self._renewed(sent, record)
        self._on_beat = True
        return max(0.0, sent + self.timing.renew_interval - self._clock.now())

    # -- the renewal path (`sidecar.renewal`): its caller holds the lock -------------------------

    def begin_renewal(self, now: float) -> int | None:
        """Step 1 of a renewal, alone or in a batch: a leader past its deadline demotes
        (rule 3) and stays out. Returns the term to renew under, or None when not leading."""
        self._watch_asked = float("inf")
        self._past_deadline(now)
        if self._role is not Role.LEADER:
            return None
        self._renewal_out = now
        return self._term

    def finish_renewal(
        self, sent: float, term: int, outcome: LeaseRecord | StoreError, *, answered: bool
    ) -> float:
        """Step 4: apply this lease's outcome of a renewal sent at ``sent`` (rules 1 and 3):
        renewed (its deadline counted from ``sent``), not owned (demoted as lost), a conflict
        or the store unavailable (retried while the deadline is ahead). ``answered``: the store
        answered the request (this entry may still be an error of its own); otherwise
        ``outcome`` is why nothing is known of any. The store probe hears of the request once,
        from the renewal path. Returns the delay until the next step."""
        self._renewal_out = None
        if answered:
            self._last_store_answer = self._clock.now()
        if isinstance(outcome, StoreUnavailable):
            self._last_error = str(outcome)
        if self._role is not Role.LEADER or self._term != term:
            # Demoted while the batch was out (its deadline passed, the watch saw another
            # grant): the answer is only an observation. A grant renewed after the deadline
            # shows our name and is taken back under a new term (rule 5).
            if isinstance(outcome, LeaseRecord):
                self.observe(outcome)
            elif isinstance(outcome, (NotOwned, Conflict)):
                self.observe(outcome.record)
            else:
                self._view.lost_sight()
            delay = self.follower_delay()
        elif isinstance(outcome, StoreError):
            delay = self._renewal_failed(outcome)
        else:
            delay = self._renewal_answered(sent, outcome)
        if self._loss_to_write_down() is not None:
            delay = 0.0  # step 4 of `step`: the next step writes it down
        now = self._clock.now()
        self._next_attempt = min(now + delay, max(now, self._watch_asked))
        return delay

    def _loss_to_write_down(self) -> int | None:
        """The term to write down in a loss marker, if any: only a follower writes one
        (rule 5, `LeaseView.loss_to_write_down`)."""
        return None if self._role is Role.LEADER else self._view.loss_to_write_down()

    async def release(
        self,
        reason: str = "released",
        timeout: float | None = None,
        successor: str | None = None,
        handed: str | None = None,
    ) -> bool:
        """Step down: demote locally first, then release the lease at the store, conditional on
        holder and term (rule 7); ``successor`` and ``handed`` for a hand-over
        (`sidecar.release`). False if not leading."""
        return await step_down(self, reason, timeout, successor, handed)

    async def give_back_handed(self, budget: float) -> None:
        """Shutting down, holding nothing: release a grant handed to us since
        (`sidecar.release`)."""
        await give_back(self, budget)

    def stand_back(self) -> None:
        """After a voluntary release: give the others the lease for one lease (rule 7)."""
        self.hold_off_until = self._clock.now() + self.timing.lease_duration
        self._next_attempt = max(self._next_attempt, self.hold_off_until)

    # -- state changes ------------------------------------------------------------------

    def become_leader(
        self,
        record: LeaseRecord,
        sent: float,
        *,
        valid_until: float | None = None,
        how: str = "acquired",
    ) -> None:
        """Lead on ``record``, our grant. ``sent``: when its request was sent (a handed grant:
        when we took it, for the renewal gaps; its deadline comes as ``valid_until``)."""
        previous = self._view.replaced_holder(record.term, self._term)
        self._term = record.term
        self._on_beat = True
        self._gaps.began(sent)
        self._role_since = self._clock.wall()
        self._role = Role.LEADER
        self.observe(record)
        # Last: the listeners' thread reads `status()` without a lock, so "leader" turns true
        # only once every other field is this reign's (a torn read once answered "leader" with
        # the follower period's `since`; the sharded chaos run, seed 3303, saw it).
        if valid_until is None:
            valid_until = sent + self.timing.lease_duration - self.timing.safety_margin
        self._valid_until = valid_until
        self.metrics.transition(Role.LEADER.value)
        log(
            logger,
            "info",
            "became leader",
            lease=self.lease,
            identity=self.identity,
            term=record.term,
            previous_holder=previous,
            how=how,
        )
        self._notify(Transition(Role.LEADER, "acquired", self.status(), previous))

    def _renewed(self, sent: float, record: LeaseRecord) -> None:
        self._gaps.renewed(sent)
        self._last_error = None
        self._valid_until = sent + self.timing.lease_duration - self.timing.safety_margin
        self.observe(record)

    def demote(self, reason: str, *, settled: asyncio.Event | None = None) -> None:
        """Stop leading now: ``/leader`` turns 503 first, then the listeners hear why."""
        if self._role is not Role.LEADER:
            return
        if reason == "deadline":
            # The gap that ends in this demotion (a stall, a pause, a store that never
            # answered) is the one the half-lease alert exists for: count and report it first.
            self._gaps.check(self._clock.now())
        self._valid_until = float("-inf")  # first: "leader" turns false before anything else
        self._role = Role.FOLLOWER
        self._role_since = self._clock.wall()
        self.metrics.transition(Role.FOLLOWER.value)
        self.metrics.demotion(reason)
        level = "info" if reason in ("released", "shutdown") else "warning"
        log(
            logger,
            level,
            "stopped leading",
            lease=self.lease,
            identity=self.identity,
            term=self._term,
            reason=reason,
            last_error=self._last_error,
        )
        self._notify(Transition(Role.FOLLOWER, reason, self.status(), None, settled))

    def observe(self, record: LeaseRecord | None, *, from_watch: bool = False) -> None:
        """Every answer from the store goes through here, timed when it *arrived*."""
        if self._view.observe(record, self._clock.now(), from_watch=from_watch):
            log(
                logger,
                "warning",
                "the store lost the lease's state; nobody is granted the lease for one lease "
                "from now, so a holder it forgot reaches its own deadline first",
                lease=self.lease,
                shows_term=record.term if record is not None else None,
                highest_term_seen=self._view.high_water,
                losses_in_a_row=self._view.losses_in_a_row,
                wait_seconds=self.timing.lease_duration,
            )
        bad = record is not None and (record.unreadable or record.ignored)
        if bad and record is not None and record.version != self._reported_version:
            self._reported_version = record.version  # once per stored version
            self.metrics.bad_record("lease", record, lease=self.lease, store=self.store.description)
        self.metrics.term.set(self._term if self._role is Role.LEADER else self._view.high_water)
        self._publish()

    def _notify(self, transition: Transition) -> None:
        self._publish()
        for listener in self._transition_listeners:
            try:
                listener(transition)
            except Exception:
                logger.exception("transition listener failed")

    def _publish(self) -> None:
        """Tell the listeners if the ETag changed: compared by what it is made of, since
        every renewal seen by every follower comes through here."""
        shown = self._shown(self._clock.now())
        if shown != self._published:
            self._published = shown
            for listener in self._change_listeners:
                try:
                    listener(self)
                except Exception:
                    logger.exception("change listener failed")

    def seconds_since_renewal(self) -> float:
        return self._gaps.since_last() if self._role is Role.LEADER else 0.0

    def hold_shown(self) -> tuple[float, float] | None:
        """For a lease on an operator's hold: (seconds since this replica first saw it, the
        hold's length); None otherwise. Read at scrape time."""
        return self._view.hold_shown(self._clock.now())

    # -- the watch ----------------------------------------------------------------------

    async def _follow_watch(self) -> None:
        """Stores reconnect their watch themselves and never end it. One that fails or ends
        anyway (a bug) is restarted by the supervisor after a back-off: without a watch
        followers still take over at the observed expiry, only slower."""
        async for record in self.store.watch():
            self.on_watch(record)
        if not self._stopping:
            raise RuntimeError(f"the watch of {self.store.description} ended")

    def on_watch(self, record: LeaseRecord | None) -> None:
        """React to a change seen by the store's watch, without a store call."""
        self.observe(record, from_watch=True)
        now = self._clock.now()
        if self._role is Role.LEADER:
            if lost_grant(record, self._term) or (record is not None and record.unreadable):
                # Renew now: the store's renew puts the grant back before anyone may take it;
                # over a record it cannot read it renews only if the store still holds our
                # holder and term (a hand edit elsewhere in the row), else we demote.
                self._ask_for_attempt(now)
            elif record is not None and (
                record.term > self._term or record.holder != self.identity
            ):
                # A grant to someone else at our term or later, a later grant, or a release of
                # our grant: the others may lead now, so stop at once (rule 5).
                self.demote(_taken_by(record))
                self._ask_for_attempt(now + self.follower_delay())
            else:
                self.store_answers()  # our grant, read again: a renewal that failed goes now
            return
        if self._loss_to_write_down() is not None:
            # Write the loss down soon (a little spread: the first marker stops the others).
            self._ask_for_attempt(now + pacing.herd_jitter(self.timing, self._rng))
            return
        self._ask_for_attempt(now + self.follower_delay())

    def _ask_for_attempt(self, at: float) -> None:
        self._next_attempt = at
        self._watch_asked = min(self._watch_asked, at)
        self.wake_scheduler(self)

    # -- timing and requests -----------------------------------------------------------

    def follower_delay(self, *, raced: bool = False) -> float:
        """Until the next attempt the view allows (`sidecar.pacing`)."""
        return pacing.follower_delay(
            self._view, self._clock.now(), self.timing, self._rng, raced=raced
        )

    def retry_delay(self) -> float:
        """A retry period, jittered (`sidecar.pacing`)."""
        return pacing.retry_delay(self.timing, self._rng)

    async def request(self, op: str, request: Callable[[], Awaitable[T]], budget: float) -> T:
        """One store request within ``budget`` seconds (`sidecar.store_call`), counted as this
        lease's. Every outcome also tells the sidecar's probe whether the store answers."""
        try:
            answer = await store_call(
                op, request, budget, clock=self._clock, count=self.metrics.store_request
            )
        except StoreUnavailable as refused:
            self._last_error = str(refused)
            if self._probe is not None:
                self._probe.refused(refused)
            raise
        except ANSWERS:
            self._store_answered()
            raise
        self._store_answered()
        return answer

    def _store_answered(self) -> None:
        self._last_store_answer = self._clock.now()
        if self._probe is not None:
            self._probe.answered()
