"""Every lease one sidecar competes for: one elector per lease over one shared store client,
the candidate records, and the balancer that spreads the leases over the live replicas.

Each lease keeps its own term, deadline, renewal and fencing, exactly as a single lease does:
the safety rules live in `sidecar.elector` and `sidecar.observed`, untouched by anything here.
This module only decides *which* replica should try for a free lease (its share) and when a
leader hands a lease over on purpose (balance, transfer, shutdown): every such move is a
release naming the successor, then a grant with a new term.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
from collections.abc import Callable, Iterable
from datetime import datetime

from sidecar.api_thread import on_loop
from sidecar.app_check import AppCheck
from sidecar.backends.base import Candidate, RenewsMany, StoreClient, StoreError
from sidecar.balance import Move, plan, share
from sidecar.candidates import CandidateBeat, CandidateView, successor_order
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.elector import Elector
from sidecar.logs import log
from sidecar.metrics import Metrics
from sidecar.observed import Attempt
from sidecar.probe import StoreProbe
from sidecar.renewal import Batching
from sidecar.schedule import Scheduler
from sidecar.status import LeaderStatus, Role, Transition
from sidecar.supervisor import Supervisor
from sidecar.timing import Timing

logger = logging.getLogger("sidecar.leases")

HANDOVER_CONCURRENCY = 16  # releases in flight at once when many leases move together
# How long a replica that holds nothing looks out, on shutdown, for a hand-over to it that a
# leader decided before it heard this replica was leaving.
LATE_HAND_OVER = 0.05
ROLLOUT_QUIET = 4  # leases a mix of revisions must stand still before it balances as one
ACQUIRE_CONCURRENCY = 8  # acquires in flight at once: renewals never queue behind hundreds
# How long the others' lease counts are reused for the share (liveness only: a count a moment
# old makes a replica stand back, or take a lease the balancer moves later).
COUNTS_FOR = 0.25


class AcquireSlots:
    """At most ``limit`` acquires in flight per sidecar, and how many are in flight now (they
    count against the share before they are granted)."""

    def __init__(self, limit: int) -> None:
        self._semaphore = asyncio.Semaphore(limit)
        self.busy = 0

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()
        self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        self.busy -= 1
        self._semaphore.release()


def _rank(lease: str, identity: str) -> int:
    """Rendezvous hashing: every replica computes the same order of candidates per lease."""
    digest = hashlib.blake2b(f"{lease}\0{identity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _named(to: str, candidates: Iterable[Candidate]) -> list[str]:
    """The identities ``to`` names: itself, else those of a pod name (identity less suffix)."""
    identities = [c.identity for c in candidates]
    exact = [identity for identity in identities if identity == to]
    return exact or [identity for identity in identities if identity.startswith(to + "_")]


class TransferRefused(Exception):
    """The transfer cannot start; ``str()`` says why and what to do. ``retry_after``: the
    seconds after which the same request may succeed (a successor still starting), or None."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LeaseSet:
    """Construct, then `prime` (one candidate beat), then `run` until `stop`."""

    def __init__(
        self,
        electors: dict[str, Elector],
        *,
        client: StoreClient | None = None,
        beat: CandidateBeat | None = None,
        clock: Clock = SYSTEM_CLOCK,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.electors = electors
        self.supervisor = supervisor or Supervisor()  # restarts the beat and the balancer
        self.client = client
        self.beat = beat
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rebalance = asyncio.Event()
        self._stopping = False
        self.aliases: dict[str, str] = {}  # the store's name -> the name users see
        self.stand_back = 0.0  # how long the others leave a free lease to the first in rank
        self._counted: tuple[float, dict[str, int]] | None = None
        # The leases this replica leads, kept by the electors' transitions: the balancer's
        # share is asked at every acquire, and counting 1,000 electors there each time cost
        # more CPU at start-up than the acquires themselves (renewals starved).
        self._leading: set[str] = set()
        track = self._track
        for elector in electors.values():
            elector.on_transition(track)
        self.slots = AcquireSlots(ACQUIRE_CONCURRENCY)
        self._last_change = float("-inf")  # when some lease's holder or term last changed
        self._mix: tuple[tuple[str, str], ...] = ()  # live candidates and their revisions
        self._mix_changed = float("-inf")
        self.probe: StoreProbe | None = None  # `open` or `run` sets it (`_share_probe`)
        # Renewals in one request per round where the store can (`open` sets it): never for
        # one lease, whose sidecar renews exactly as before batching.
        self.batching: Batching[Elector] | None = None
        self.scheduler: Scheduler[Elector] | None = None  # the one clock of every elector (`run`)
        # The group's records as last read for ``GET /leases`` (`read_candidates`), when the
        # last read was tried (answered or not), and one read at a time (made on the
        # election's loop, on first use).
        self._shown: list[Candidate] | None = None
        self._shown_at = float("-inf")  # when they were read
        self._shown_tried = float("-inf")
        self._shown_lock: asyncio.Lock | None = None
        # Leadership follows the app (`use_app`): None without an app check.
        self.app: AppCheck | None = None
        self._app_wake = asyncio.Event()  # the app or the candidates changed: look again
        self._app_alone_since: float | None = None  # leading with the app down, nobody to take it
        self.draining = False  # SIGTERM with an app check: 503, lease kept until the app stops
        self.count_handover: Callable[[str], None] = lambda reason: None
        # Told once per episode of leading with the app down and nobody to hand over to: the
        # leases kept, and why the app is down (the Kubernetes store records an Event).
        self.on_app_alone: Callable[[list[str], str | None], None] = lambda leases, why: None

    def _track(self, transition: Transition) -> None:
        """Every elector's transitions (one bound method for all, not a closure each)."""
        if transition.role is Role.LEADER:
            self._leading.add(transition.status.lease)
        else:
            self._leading.discard(transition.status.lease)

    def use_app(self, app: AppCheck, count_handover: Callable[[str], None]) -> None:
        """Lead only while ``app`` is up (`sidecar.app_check`): campaign only then, and hand
        every lease over to a replica whose app is up when it goes down. ``count_handover``
        counts each such move by reason (``app_down``, ``drain``, ``hold``)."""
        self.app = app
        self.count_handover = count_handover
        app.on_change(self._app_changed)
        if self.beat is not None:
            self.beat.app_is(app.up)  # the first beat says it: an app starts down
        for elector in self.electors.values():
            elector.on_transition(self._on_transition_for_app)

    def _app_changed(self, up: bool) -> None:
        if self.beat is not None:
            self.beat.app_is(up)
        self._app_wake.set()
        if up:
            self._app_alone_since = None
            self._candidates_changed()  # every lease may be tried now

    def _on_transition_for_app(self, transition: Transition) -> None:
        if transition.reason == "hold":
            self.count_handover("hold")
        elif transition.role is Role.LEADER and self.app_down:
            self._app_wake.set()  # handed a lease in a race with our app going down

    @property
    def app_down(self) -> bool:
        """An app check is configured and says the app is down."""
        return self.app is not None and not self.app.up

    @classmethod
    def single(cls, elector: Elector) -> LeaseSet:
        """One elector and no candidates (tests, and embedding one `Elector`)."""
        return cls({elector.lease: elector}, clock=elector.clock)

    def _share_probe(self, rng: random.Random | None = None) -> None:
        """One probe of a refusing store for every lease and the candidate beat: while the
        store refuses, they wait for it instead of each retrying (`sidecar.probe`)."""
        primary = self.primary
        self.probe = StoreProbe(
            primary.store.read,
            primary.timing.retry_period,
            primary.timing.request_timeout,
            clock=self._clock,
            rng=rng,
            count=primary.metrics.store_request,
            spawn=self.supervisor.spawn,
        )
        for elector in self.electors.values():
            elector.use_probe(self.probe)
        if self.beat is not None:
            self.beat.use_probe(self.probe)
        self.probe.on_back(self._store_back)

    def _store_back(self) -> None:
        """The store answers again: every elector waiting for it tries now — a leader whose
        renewal failed renews at once —, the beat too."""
        for elector in self.electors.values():
            elector.poke()
            elector.store_answers()
        if self.beat is not None:
            self.beat.wake()

    @classmethod
    def open(
        cls,
        client: StoreClient,
        names: Iterable[tuple[str, str]],
        timing: Timing,
        identity: str,
        *,
        group: str,
        registry_metrics: Callable[[str], Metrics],
        revision: str = "",
        priority: int = 0,
        stand_back: float = 0.0,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        supervisor: Supervisor | None = None,
    ) -> LeaseSet:
        """``names``: (store name, name users see — ``namespace/name`` on Kubernetes)."""
        names = list(names)
        # One generator for every elector's jitter: each of its own was 2.5 KB of state.
        rng = rng or random.Random()
        me = Candidate(identity, "", revision, priority, False, clock.wall())
        # Several leases: the balancer needs to know within about a lease who is alive, so
        # beat every renew interval. One lease: the candidates only steer a hand-over, so beat
        # less and judge alive over 1.5 leases — yet often enough that the beat a hand-over
        # names leaves the successor a lease to lead on (`Timing.handed_reach`) even when it
        # comes late: at most every half reach (a third of the lease by default), so a beat
        # may come that much late (a loaded machine, a failed request) before the successor
        # must write a grant of its own, a round trip and a term more.
        several = len(names) > 1
        interval = (
            timing.renew_interval
            if several
            else min(timing.lease_duration / 2, timing.handed_reach / 2)
        )
        alive_for = timing.lease_duration if several else 1.5 * timing.lease_duration
        view = CandidateView(me, alive_for)
        electors: dict[str, Elector] = {}
        lease_set = cls(electors, client=client, clock=clock, supervisor=supervisor)
        lease_set.stand_back = stand_back
        slots = lease_set.slots
        # One bound method each for every elector (a sidecar may run 10,000 of them).
        gate, beat_sent_at = lease_set._gate, lease_set._beat_sent_at
        note_change, track = lease_set._note_change, lease_set._track
        for name, shown in names:
            lease_set.aliases[name] = shown
            electors[shown] = Elector(
                client.lease(name),
                timing,
                identity,
                shown,
                metrics=registry_metrics(shown),
                clock=clock,
                rng=rng,
                stand_back=stand_back,
                gate=gate,
                acquire_slots=slots,
                beat_sent_at=beat_sent_at,
                supervisor=lease_set.supervisor,
            )
            electors[shown].on_change(note_change)
            electors[shown].on_transition(track)
        if several and isinstance(client, RenewsMany):
            by_name = dict(zip(electors.values(), (name for name, _ in names), strict=True))
            lease_set.batching = Batching(client, by_name, lease_set.primary.metrics.store_request)
        lease_set.beat = CandidateBeat(
            client.candidates(group),
            view,
            timing.lease_duration,
            interval,
            timing.request_timeout,
            clock=clock,
            on_change=lease_set._candidates_changed,
            needs_list=lambda: several or bool(lease_set.held()),
            # A version read now was written up to a beat ago (every replica beats alike), and
            # the hand-over reaches the successor a little later still: half a beat of the
            # reach is left for that and for a beat that comes late.
            versions_fresh_for=max(0.0, timing.handed_reach - 1.5 * interval),
            count=lease_set.primary.metrics.store_request,
            on_bad=lambda bad: lease_set.primary.metrics.bad_record(
                "candidate", bad, identity=bad.identity, group=group
            ),
        )
        lease_set._share_probe(rng)
        return lease_set

    # -- what the API reads ---------------------------------------------------------------

    @property
    def primary(self) -> Elector:
        return next(iter(self.electors.values()))

    @property
    def identity(self) -> str:
        return self.primary.identity

    def get(self, lease: str) -> Elector | None:
        """By the name users see (``namespace/name`` on Kubernetes) or the bare name."""
        return self.electors.get(lease) or self.electors.get(self.aliases.get(lease, ""))

    def statuses(self) -> list[LeaderStatus]:
        return [elector.status() for elector in self.electors.values()]

    def store_answered_within(self, seconds: float) -> bool:
        """For ``/readyz``: did the store answer any of our requests recently — one lease's,
        or the candidate records'? (With many leases, a replica at its share may send no
        lease request at all for a while.)"""
        if self.beat is not None and self._clock.now() - self.beat.answered_at <= seconds:
            return True
        return any(e.store_answered_within(seconds) for e in self.electors.values())

    @property
    def last_error(self) -> str | None:
        """The store's last error for ``/readyz`` and the state log: the first lease's own, or
        the one that made the store probe take over (then no elector sends, so none has one)."""
        own = self.primary.last_error
        if own is None and self.probe is not None and self.probe.refusing:
            return self.probe.last_error
        return own

    def held(self) -> list[str]:
        return [name for name, elector in self.electors.items() if elector.is_leader()]

    def candidates(self) -> list[dict[str, object]]:
        """The candidates for ``GET /leases`` (`shown_candidates`)."""
        if self.beat is None:
            return []
        records, live = self.shown_candidates()
        return [
            {
                "identity": c.identity,
                "live": c.identity in live,
                "revision": c.revision or None,
                "priority": c.priority,
                "leaving": c.leaving,
                "app": c.app or None,
            }
            for c in records
        ]

    def shown_candidates(self) -> tuple[list[Candidate], set[str]]:
        """The candidate records to show, and which are live. After a `read_candidates` (what
        ``GET /leases`` does first): the store's records, the same on every replica
        (a follower, which reads the group only when it needs to, showed none or an old copy),
        live judged as ``status`` judges it, from the store's beat stamps. Else this replica's
        view, live as it judges successors (versions seen changing, `CandidateView`)."""
        assert self.beat is not None
        now = self._clock.now()
        if self._shown is not None and now - self._shown_at < 2 * self.beat.interval:
            wall = self._clock.wall()
            alive_for = self.beat.view.alive_for
            return self._shown, {
                c.identity
                for c in self._shown
                if not c.leaving
                and c.beat_at is not None
                and (wall - c.beat_at).total_seconds() < alive_for
            }
        return self.beat.view.all(), {c.identity for c in self.beat.view.live(now)}

    async def read_candidates(self) -> None:
        """Read the group's records for `candidates`, at most once a beat interval however
        often ``GET /leases`` is asked — answered or not: a flood on the public listener
        costs the store one read a beat, also while it is slow —, one read at a time; none
        while the store refuses (the sidecar's probe waits for it). A read that fails leaves
        the last records shown."""
        await on_loop(self._loop, self._read_candidates())

    async def _read_candidates(self) -> None:
        beat = self.beat
        if beat is None:
            return
        self._shown_lock = self._shown_lock or asyncio.Lock()
        async with self._shown_lock:  # the requests behind the first find its read fresh
            if self.probe is not None and self.probe.refusing:
                return
            if self._clock.now() - self._shown_tried < beat.interval:
                return
            self._shown_tried = self._clock.now()
            await self._read_shown(beat)

    async def _read_shown(self, beat: CandidateBeat) -> None:
        count = self.primary.metrics.store_request
        started = self._clock.now()
        try:
            async with asyncio.timeout(self.primary.timing.request_timeout):
                records = await beat.registry.list()
        except (StoreError, TimeoutError) as exc:
            outcome = "timeout" if isinstance(exc, TimeoutError) else "unavailable"
            count("candidate_list", outcome, self._clock.now() - started)
            return
        count("candidate_list", "ok", self._clock.now() - started)
        self._shown = [r for r in records if r.unreadable is None]
        self._shown_at = self._clock.now()

    # -- running --------------------------------------------------------------------------

    async def prime(self, timeout: float) -> None:
        """One candidate beat before any elector runs, so that the first shares count the
        replicas already there (fewer hand-overs at start-up)."""
        if self.beat is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.beat.once()

    async def run(self) -> None:
        """Every elector on one scheduler, the candidate beat and the balancer; returns when
        stopped, raises if an elector's step fails (a bug)."""
        self._loop = asyncio.get_running_loop()
        if self.probe is None:
            self._share_probe()
        self.scheduler = Scheduler(
            self.electors.values(), clock=self._clock, batching=self.batching
        )
        self.scheduler.begin()  # the first attempts go before the helpers' first requests
        helpers = []
        if self.app is not None:
            helpers.append(self.supervisor.spawn("app-check", self.app.run))
            helpers.append(self.supervisor.spawn("app-follow", self._follow_app))
        if self.beat is not None:
            helpers.append(self.supervisor.spawn("candidates", self.beat.run))
            helpers.append(self.supervisor.spawn("candidates-follow", self.beat.follow))
            if len(self.electors) > 1:
                helpers.append(self.supervisor.spawn("balance", self._balance))
        try:
            await self.scheduler.run()
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self.probe is not None:
                await self.probe.close()

    def stop(self) -> None:
        self._stopping = True
        for elector in self.electors.values():
            elector.stop()

    # -- shares and balance ---------------------------------------------------------------

    def _live(self) -> list[Candidate]:
        if self.beat is None or not self.beat.view.listed:
            return []
        return self.beat.view.live(self._clock.now())

    def _gate(self, elector: Elector, attempt: Attempt) -> float:
        """Seconds this replica should wait before trying for a free or expired lease (0: go).

        * Over its share of the live replicas (ceil(N/R)): wait; the balancer pokes it when
          the share grows. Everyone may while the candidates are unknown.
        * Otherwise, the live replica under its share that ranks first for this lease
          (rendezvous hashing) goes at once and the others stand back ``stand_back`` seconds
          from when they saw the lease free: at start-up each of 1,000 free leases is tried
          by one replica, not raced for by all (every refused race is a write that queues the
          renewals behind it), and the first spread is nearly even without hand-overs.
        """
        if self.app_down or self.draining:
            # Never campaign for an app that is down (or stopping): it could not do the work.
            # `_app_changed` pokes every lease when it is up again.
            return self.primary.timing.lease_duration
        if len(self.electors) == 1:
            return 0.0
        live = self._live()
        if not live:
            return 0.0
        cap = share(len(self.electors), len(live))
        # Ours fresh, plus the other acquires in flight (the caller holds one slot itself).
        mine = len(self._leading) + self.slots.busy - 1
        if mine >= cap:
            return self.primary.timing.renew_interval
        counts = {**self._counts(), self.identity: mine}
        takers = [c.identity for c in live if counts.get(c.identity, 0) < cap]
        # A replica seen once, not yet beating, counts in no share; it ranks only for who
        # tries first (at a cold start, before anyone saw another beat): a record written
        # once then costs the others a stand-back, never a lease.
        assert self.beat is not None  # (live is empty without candidates)
        pending = self.beat.view.pending(self._clock.now())
        takers += [c.identity for c in pending if counts.get(c.identity, 0) < cap]
        first = max(takers, key=lambda identity: _rank(elector.lease, identity))
        if first == self.identity:
            return 0.0
        seen = elector.view.unchanged_since
        waited = 0.0 if seen is None else self._clock.now() - seen
        return max(0.0, self.stand_back - waited)

    def _counts(self) -> dict[str, int]:
        """Leases per holder as observed, recomputed at most every `COUNTS_FOR` seconds
        (1,000 electors ask at start-up, and each count looks at every lease)."""
        now = self._clock.now()
        # (Each count looks at every lease: at 10,000 leases, 50 ms; reused a little longer.)
        reuse = max(COUNTS_FOR, len(self.electors) / 4000)
        if self._counted is None or now - self._counted[0] > reuse:
            counts: dict[str, int] = {}
            for holder in self.holders().values():
                if holder is not None:
                    counts[holder] = counts.get(holder, 0) + 1
            self._counted = (now, counts)
        return self._counted[1]

    def holders(self) -> dict[str, str | None]:
        """Lease → holder as observed now; None when free or expired here."""
        now = self._clock.now()
        holders: dict[str, str | None] = {}
        for name, elector in self.electors.items():
            if elector.is_leader():
                holders[name] = elector.identity
                continue
            record = elector.view.record
            expired = elector.view.expires_in(now) <= 0
            holders[name] = None if record is None or expired else record.holder
        return holders

    def _candidates_changed(self) -> None:
        self._rebalance.set()
        self._app_wake.set()  # a replica whose app is up may have appeared
        for elector in self.electors.values():
            elector.poke()  # a share may have grown

    def _note_change(self, _elector: Elector) -> None:
        self._last_change = self._clock.now()
        self._rebalance.set()
        if self.beat is not None:
            self.beat.wake_follow()  # a leader of one lease follows the group, a follower not

    async def _balance(self) -> None:
        quiet_for = self.primary.timing.renew_interval
        while not self._stopping:
            await self._rebalance.wait()
            self._rebalance.clear()
            # Plan only on a view that has been still for a renew interval: replicas that
            # plan on views a moment apart (a hand-over seen by one, not yet by another)
            # would hand the same surplus over twice, and back.
            quiet = self._clock.now() - self._last_change
            if quiet < quiet_for:
                await asyncio.sleep(quiet_for - quiet)
                self._rebalance.set()
                continue
            candidates = self._live()
            live = [c.identity for c in candidates]
            moves = [m for m in self._plan(candidates) if m.giver == self.identity]
            if moves:
                log(
                    logger,
                    "info",
                    "handing leases over to balance the replicas",
                    moves=len(moves),
                    live_replicas=len(live),
                    leases=len(self.electors),
                    share=share(len(self.electors), len(live)),
                )
                await self._hand_over(moves, "balance")

    def _plan(self, candidates: list[Candidate]) -> list[Move]:
        """The balancer's moves. While the mix of live revisions keeps changing (a rolling
        update: new replicas join, old ones leave), none: a lease pulled to a new replica now,
        or levelled between new replicas, moves again when the next old one leaves. Old
        replicas hand their leases to the least loaded new ones as they leave (`_successors`),
        so each lease moves once and the new replicas end up level. Once the mix has stood
        still for `ROLLOUT_QUIET` leases (the rollout is over, or a canary stays beside the
        old revision), all balance as one."""
        now = self._clock.now()
        mix = tuple(sorted((c.identity, c.revision) for c in candidates))
        if mix != self._mix:
            self._mix, self._mix_changed = mix, now
        revisions = {c.revision for c in candidates}
        quiet = ROLLOUT_QUIET * self.primary.timing.lease_duration
        if len(revisions) > 1 and now - self._mix_changed < quiet:
            return []
        return plan(self.holders(), [c.identity for c in candidates])

    async def _hand_over(self, moves: list[Move], why: str) -> None:
        for move in moves:
            log(
                logger,
                "info",
                "handing the lease over",
                lease=move.lease,
                to=move.receiver,
                why=why,
            )
        await self._release_all(
            [m.lease for m in moves], {m.lease: m.receiver for m in moves}, "released"
        )

    async def _release_all(
        self,
        names: list[str],
        successors: dict[str, str],
        reason: str,
        deadline: float | None = None,
    ) -> list[str]:
        """Release ``names`` (each naming its successor, if any), a bounded number at once;
        ``deadline`` (loop time) bounds each release. Returns the leases released."""
        loop = asyncio.get_running_loop()
        limit = asyncio.Semaphore(HANDOVER_CONCURRENCY)

        async def one(name: str) -> bool:
            async with limit:
                timeout = None if deadline is None else max(0.05, deadline - loop.time() - 0.1)
                successor = successors.get(name)
                return await self.electors[name].release(
                    reason,
                    timeout=timeout,
                    successor=successor,
                    handed=self._handed_version(successor),
                )

        results = await asyncio.gather(*(one(name) for name in names), return_exceptions=True)
        return [name for name, result in zip(names, results, strict=True) if result is True]

    def _handed_version(self, successor: str | None) -> str | None:
        """The version of ``successor``'s candidate record this replica chose it by: with it
        the release grants the lease to the successor in the same write (a hand-over)."""
        if successor is None or self.beat is None:
            return None
        return self.beat.view.version_of(successor)

    def _beat_sent_at(self, version: str) -> float | None:
        return self.beat.sent_at(version) if self.beat is not None else None

    # -- leadership follows the app ------------------------------------------------------

    async def _follow_app(self) -> None:
        """While the app is down, hand every lease this replica leads to a replica whose app
        is up, at once, in one write each (rule 7's hand-over). With none up, keep the leases
        (never worse than leading for an app that cannot work: nobody could do it) and say
        so; look again at every change of the candidates, and every app check period on a
        store whose candidates are not followed, so that the lease moves within a period of
        another app coming up."""
        assert self.app is not None
        period = self.app.settings.period
        while not self._stopping:
            self._app_wake.clear()
            wait: float | None = None
            if self.app_down and not self.draining and self.held():
                if await self._hand_over_for_app("app_down"):
                    continue
                wait = None if self.beat is not None and self.beat.current() else period
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._app_wake.wait()

    async def _hand_over_for_app(self, reason: str) -> bool:
        """Hand every lease held to the best replica whose app is up. False: none is."""
        held = self.held()
        await self._fresh_candidates(self.primary.timing.request_timeout)
        successors = self._successors(held) or self._pending_successors(held)
        why = self.app.last_problem if self.app is not None else None
        if not successors:
            if self._app_alone_since is None:
                self._app_alone_since = self._clock.now()
                self.on_app_alone(held, why)
                log(
                    logger,
                    "warning",
                    "the app is down and no other replica's app is up: keeping the leases "
                    "until one is",
                    leases=held,
                    reason=why,
                )
            return False
        self._app_alone_since = None
        log(
            logger,
            "warning",
            "the app is down: handing the leases to a replica whose app is up",
            leases=len(successors),
            to=sorted(set(successors.values())),
            reason=why,
        )
        released = await self._release_all(list(successors), successors, reason)
        for _ in released:
            self.count_handover(reason)
        return bool(released)

    def _pending_successors(self, leases: list[str]) -> dict[str, str]:
        """With no live replica to hand over to: one seen with a single version so far whose
        record says its app is up (a leader that has just started, or follows a store whose
        candidates are not streamed, has read the group once; the next beat that proves it
        alive may be a beat interval away). Keeping the lease for an app that is down leaves
        the job undone for sure; such a record may be stale, which leaves it undone for a
        lease at most — the same, never worse (liveness only: the grant is conditional as
        ever)."""
        if self.beat is None:
            return {}
        pending = [c for c in self.beat.view.pending(self._clock.now()) if c.app in ("up", "")]
        if not pending:
            return {}
        best = max(pending, key=successor_order(self.beat.view.me))
        return {lease: best.identity for lease in leases}

    @property
    def app_down_alone_seconds(self) -> float:
        """How long this replica has led with its app down and nobody else's up (0: not)."""
        since = self._app_alone_since
        if since is None or not self.held():
            return 0.0
        return self._clock.now() - since

    async def drain(self, timeout: float) -> str:
        """SIGTERM with an app check (`Sidecar.stop`): answer 503 at once so the app learns
        it must stop, keep the leases (renewed as usual) until the app has stopped — its check
        fails, or it releases the leases itself — at most ``timeout``; then the shutdown hands
        them over. Returns how it ended: ``none`` (nothing to drain), ``app_stopped``,
        ``released`` or ``timeout``."""
        app = self.app
        if app is None or timeout <= 0 or not self.held():
            return "none"
        self.draining = True
        for elector in self.electors.values():
            elector.mute()
        if self.beat is not None:
            self.beat.leaving()  # hand this replica nothing meanwhile
            self.beat.wake()
        log(
            logger,
            "info",
            "draining: answering 503 and keeping the leases until the app has stopped",
            leases=self.held(),
            timeout_seconds=timeout,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if not app.up:
                outcome = "app_stopped"
                break
            if not self.held():
                outcome = "released"
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                outcome = "timeout"
                break
            await app.wait_for(False, min(remaining, 0.05))
        log(
            logger,
            "warning" if outcome == "timeout" else "info",
            "drain ended" if outcome != "timeout" else "drain timed out; releasing anyway",
            outcome=outcome,
            leases=self.held(),
        )
        return outcome

    # -- moved on purpose -----------------------------------------------------------------

    def resolve(self, to: str) -> str | None:
        """``any`` → the best live successor (None if nobody else is live); an identity, or
        a unique prefix of one (a pod name) → that live candidate. Raises `TransferRefused`."""
        others = [c for c in self._live() if c.identity != self.identity]
        if to == "any":
            if not others:
                return None
            assert self.beat is not None  # there are live others only with candidates
            return max(others, key=successor_order(self.beat.view.me)).identity
        matches = _named(to, others)
        if len(matches) != 1:
            names = ", ".join(c.identity for c in others) or "none"
            if not matches and self._starting(to):
                assert self.beat is not None  # (a pending candidate is one of the view's)
                wait = max(1, math.ceil(self.beat.interval))
                raise TransferRefused(
                    f"{to} is starting: seen beating once, it is a successor once seen beating "
                    f"again, within one beat; retry in {wait} s. Live candidates: {names}",
                    retry_after=wait,
                )
            what = "matches several" if matches else "is not a live candidate"
            if not matches and self._app_down_candidate(to):
                what = "has its app down (a replica whose app is down is never handed a lease)"
            raise TransferRefused(f"{to} {what}; live candidates: {names}")
        return matches[0]

    def _starting(self, to: str) -> bool:
        """``to`` names a candidate seen with one version only (`CandidateView.pending`): a
        replica that has just started, most likely. For ``any``: there is one."""
        if self.beat is None:
            return False
        pending = self.beat.view.pending(self._clock.now())
        return bool(pending) if to == "any" else len(_named(to, pending)) == 1

    async def _resolve_fresh(self, to: str) -> str | None:
        """`resolve`, reading the group once more first where ``to`` would be a replica seen
        beating once: it becomes a successor once seen beating again, and it may have beaten
        since this replica's view was read (409s after it answered ``/leader``, and
        ``any`` found nobody). Still seen once, it is one within a beat: `resolve` says so,
        with when to retry. (A replica beats twice as it starts, `prime` then `run`, a few
        ms apart: a view read after both saw one version, and waits for the third.)"""
        try:
            successor = self.resolve(to)
        except TransferRefused:
            if not self._starting(to):
                raise
        else:
            if successor is not None or not self._starting(to):
                return successor
        assert self.beat is not None  # (a pending candidate is one of the view's)
        await self.beat.refresh(self.primary.timing.request_timeout)
        return self.resolve(to)

    def _app_down_candidate(self, to: str) -> bool:
        """``to`` names a candidate (an identity or its pod name) whose app is down."""
        if self.beat is None:
            return False
        return any(
            c.app == "down" and (c.identity == to or c.identity.startswith(to + "_"))
            for c in self.beat.view.all()
        )

    async def transfer(self, lease: str | None, to: str) -> tuple[list[str], str | None]:
        """Hand ``lease`` (None: every lease this replica holds) to ``to``: demote, then
        release naming the successor. Returns (leases handed over, successor)."""
        return await on_loop(self._loop, self._transfer(lease, to))

    async def _fresh_candidates(self, timeout: float) -> None:
        """Before choosing a successor, the candidates as they are now: in a rolling update
        the controller stops an old pod right after a new one turned ready, so a list read even
        a moment before may miss the very replica the lease should go to (the rollout benchmark
        saw stale lists hand the lease to an old replica, or to one already gone). A view kept
        current by the group's change stream (Redis, Kubernetes) is used as it is; otherwise
        one read, a round trip on the hand-over — also when the versions it names may be too
        old for the successor to lead on (`CandidateBeat.versions_fresh`)."""
        if self.beat is not None and not (self.beat.current() and self.beat.versions_fresh()):
            await self.beat.refresh(timeout)

    async def _transfer(self, lease: str | None, to: str) -> tuple[list[str], str | None]:
        await self._fresh_candidates(self.primary.timing.request_timeout)
        if lease is not None:
            elector = self.get(lease)
            if elector is None:
                raise TransferRefused("this sidecar has no such lease; GET /leases lists them")
            lease = elector.lease
        successor = await self._resolve_fresh(to)
        names = [lease] if lease is not None else self.held()
        names = [name for name in names if self.electors[name].is_leader()]
        if not names:
            raise TransferRefused("this replica holds no lease to transfer")
        named = {name: successor for name in names} if successor else {}
        handed = await self._release_all(names, named, "released")
        log(logger, "info", "transferred", leases=handed, to=successor or "anyone")
        return handed, successor

    async def release(self, lease: str | None) -> bool:
        """``POST /leader/release``: step down from ``lease`` (None: every lease held). With
        several leases each goes to the best successor at once, so that a shard is not left
        without a leader while every other replica is at its share."""
        return await on_loop(self._loop, self._release(lease))

    async def _release(self, lease: str | None) -> bool:
        if len(self.electors) > 1:
            await self._fresh_candidates(self.primary.timing.request_timeout)
        if lease is None:
            names = self.held()
        else:
            elector = self.get(lease)
            if elector is None:
                return False
            names = [elector.lease]
        if len(self.electors) == 1:
            return await self.primary.release("released")
        return bool(await self._release_all(names, self._successors(names), "released"))

    async def shutdown(self, reason: str, budget: float) -> bool:
        """Leave: hand every lease this replica holds to the best successor (a replica of the
        newer revision in a rolling update), and remove its candidate record."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        held = self.held()
        if held:  # (nothing to choose a successor for otherwise)
            await self._fresh_candidates(min(0.25, budget / 4))
        successors = self._successors(held)
        if successors:
            log(
                logger,
                "info",
                "handing the leases over on shutdown",
                leases=len(successors),
                to=sorted(set(successors.values())),
            )
        # The hand-over goes first: it is what the successor waits for. Then one request takes
        # this replica's record away (marked leaving here first, so that a beat racing the
        # removal writes "leaving"). With several leases the releases take a while and other
        # replicas balance meanwhile, so the record goes beside them and nobody hands this
        # replica a lease in between; with one lease nobody balances, and the request stays off
        # the hand-over's path (it would reach the store before the release).
        removal: list[asyncio.Task[None]] = []
        if self.beat is not None:
            self.beat.leaving()
            if len(self.electors) > 1:
                removal.append(asyncio.create_task(self.beat.remove(min(0.2, budget / 4))))
        # Every lease, not only those held now: a grant in flight completes before its
        # elector's lock lets the release in (then it goes without a named successor).
        released = await self._release_all(list(self.electors), successors, reason, deadline)
        if self.beat is not None and not removal:
            await self.beat.remove(max(0.01, min(0.2, deadline - loop.time())))
        await asyncio.gather(*removal, return_exceptions=True)
        await self._give_back_late_hand_overs(bool(held), deadline)
        return bool(released)

    async def _give_back_late_hand_overs(self, held: bool, deadline: float) -> None:
        """A leader that chose this replica a moment before it could know it was leaving (the
        removal above tells it) may still hand it a lease. Look once, a little later, and
        release what was handed: free at once instead of waited out. With one lease, only if
        this replica did not hold it (it has just handed it on). With several, every lease
        another replica held as last seen (only a holder hands over): one read each, as at
        start-up, a bounded number at once (the watches have stopped with the electors)."""
        if not self.primary.store.hands_over or (held and len(self.electors) == 1):
            return
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, min(LATE_HAND_OVER, deadline - loop.time() - 0.1)))
        if len(self.electors) == 1:
            looked_at = [self.primary]
        else:
            looked_at = [
                elector
                for elector in self.electors.values()
                if elector.status().holder not in (None, self.identity)
            ]
        limit = asyncio.Semaphore(HANDOVER_CONCURRENCY)

        async def look(elector: Elector) -> None:
            async with limit:
                await elector.give_back_handed(max(0.01, deadline - loop.time()))

        await asyncio.gather(*(look(elector) for elector in looked_at))

    def _successors(self, leases: list[str]) -> dict[str, str]:
        """Per lease, the best live successor: higher priority, then another revision (the
        new one in a rolling update), then the least loaded, then the newest."""
        if self.beat is None:
            return {}
        me = self.beat.view.me
        others = [c for c in self._live() if c.identity != self.identity and not c.leaving]
        if not others:
            return {}
        holders = self.holders()
        load = {c.identity: 0 for c in others}
        for holder in holders.values():
            if holder in load:
                load[holder] += 1
        order = successor_order(me)

        def key(c: Candidate) -> tuple[int, int, int, datetime, str]:
            priority, other_revision, started, identity = order(c)
            return (priority, other_revision, -load[c.identity], started, identity)

        chosen: dict[str, str] = {}
        for lease in leases:
            best = max(others, key=key)
            chosen[lease] = best.identity
            load[best.identity] += 1
        return chosen
