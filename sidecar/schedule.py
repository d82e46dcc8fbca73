"""One clock for every lease of a sidecar: the scheduler the electors run on.

One loop keeps every elector's next moment in one heap — its next attempt, its deadline and the
half-lease mark of its renewal gap (`Elector.wake_at`) — and at each moment does what the
elector's own loop used to do: the time-driven transitions (`Elector.tick`), then the step
that is due. A thousand leases are then one task and one timer, not a thousand of each.

Renewals that are due together go in one request where the store can renew many leases at
once (`RenewsMany`): every lease this replica leads whose renewal is due within half a renew
interval goes with the one that is due, so that after a round or two the leases renew in one
batch per renew interval. A batch takes the one renewal path (`sidecar.renewal`) a lease renewing
alone takes, which applies each lease's outcome to that lease (rules 1 and 3 per lease). A store
without a multi-object write (Kubernetes) renews each lease with a request of its own, and so
does a sidecar of one lease: each leader's step is then a batch of one.

What the scheduler needs of an elector is `Scheduled`; it never takes an elector's lock (the
renewal path does) nor reads its state.

Renewals first: at each moment the batch of due renewals starts before any follower's step,
and a follower's step (an acquire, a read, a loss marker) waits for the acquire slots
(`sidecar.lease_set.AcquireSlots`), never a renewal.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from sidecar.backends.base import MAX_BATCH
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.renewal import Batching, Renewing

INFINITY = float("inf")


class Scheduled(Renewing, Protocol):
    """What the scheduler needs of an elector (`sidecar.elector.Elector`): its moments, its
    time-driven transitions, its step, and — for the leases it hands to a batch — what the
    renewal path needs (`Renewing`)."""

    @property
    def wake_scheduler(self) -> Callable[[Any], None]:
        """Set by the scheduler: called with the elector when it may be due sooner than it
        was (a watch event, a poke, a stop)."""
        ...

    @wake_scheduler.setter
    def wake_scheduler(self, wake: Callable[[Any], None]) -> None: ...

    @property
    def stopping(self) -> bool: ...

    def start_watch(self) -> asyncio.Task[None] | Callable[[], None]:
        """Follow the store's watch: a task, or the function that stops a store's calls."""
        ...

    def wake_at(self) -> float:
        """The next moment to look at it: its next attempt, or a timer."""
        ...

    def timers(self) -> list[float]:
        """The moments to wake for without a store call (deadline, half-lease mark)."""
        ...

    def tick(self, now: float) -> None:
        """Time-driven transitions, no I/O."""
        ...

    def due(self, now: float) -> bool:
        """Its next attempt has come."""
        ...

    async def step(self) -> float:
        """One acquire-or-renew step."""
        ...

    def may_renew(self) -> bool:
        """Leading, and free to join a batch now."""
        ...

    def renews_by(self, horizon: float) -> bool:
        """Leading on its usual beat, with a renewal due by ``horizon``."""
        ...


S = TypeVar("S", bound=Scheduled)


def _unscheduled(elector: object) -> None:
    """An elector's ``wake_scheduler`` once no scheduler runs it: nobody to tell."""


class Scheduler(Generic[S]):
    """Runs ``electors`` until every one of them is stopped (`Elector.stop`), or until
    cancelled; raises what a step raised (a bug)."""

    def __init__(
        self,
        electors: Iterable[S],
        *,
        clock: Clock = SYSTEM_CLOCK,
        batching: Batching[S] | None = None,
    ) -> None:
        self.electors = list(electors)
        self._clock = clock
        self._batching = batching
        self._heap: list[tuple[float, int, S]] = []
        self._queued: dict[S, float] = {}  # each elector's earliest live heap entry
        self._order = itertools.count()
        self._busy: set[S] = set()  # a step or a batch of theirs is in flight
        self._work: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._sleeping_until = -INFINITY  # while the loop runs, nobody needs to wake it
        self._watches: list[asyncio.Task[None] | Callable[[], None]] | None = None

    # -- what the electors tell it ----------------------------------------------------------

    def _push(self, elector: S, at: float) -> None:
        """Look at ``elector`` at ``at``, unless it is to be looked at sooner already."""
        if at == INFINITY or at >= self._queued.get(elector, INFINITY):
            return
        self._queued[elector] = at
        heapq.heappush(self._heap, (at, next(self._order), elector))
        if at < self._sleeping_until:
            self._wake.set()

    def _woken(self, elector: S) -> None:
        """An elector may be due sooner (a watch event, a poke, a stop)."""
        if elector.stopping:
            self._wake.set()  # (the loop ends once every elector stops)
        elif elector in self._busy:
            self._push(elector, min(elector.timers(), default=INFINITY))
        else:
            self._push(elector, elector.wake_at())

    # -- the loop ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Start the watches and the steps due now, before anything else runs (the owner's
        other tasks start after the first attempts, as when each elector had a task)."""
        if self._watches is not None:
            return
        self._watches = [elector.start_watch() for elector in self.electors]
        woken = self._woken  # one bound method for every elector, not one each
        for elector in self.electors:
            elector.wake_scheduler = woken
            self._push(elector, elector.wake_at())
        self._dispatch(self._pop_due(self._clock.now()))

    async def run(self) -> None:
        self.begin()
        assert self._watches is not None
        try:
            while not all(elector.stopping for elector in self.electors):
                self._wake.clear()
                self._sleeping_until = -INFINITY
                self._dispatch(self._pop_due(self._clock.now()))
                if self._failure is not None:
                    raise self._failure
                until = self._heap[0][0] if self._heap else INFINITY
                self._sleeping_until = until
                delay = None if until == INFINITY else max(0.0, until - self._clock.now())
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            # Stopped: what is in flight finishes (each bounded by a request timeout).
            await asyncio.gather(*self._work, return_exceptions=True)
        finally:
            # (A watch is a task, or the function that stops a store's calls: `FollowsByCall`.)
            tasks = [*self._work]
            for watch in self._watches:
                if isinstance(watch, asyncio.Task):
                    tasks.append(watch)
                else:
                    watch()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for elector in self.electors:
                elector.wake_scheduler = _unscheduled

    def _pop_due(self, now: float) -> list[S]:
        """Every elector whose moment has come: its timers ticked, and those due for a step."""
        due: list[S] = []
        later: list[tuple[S, float]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, elector = heapq.heappop(heap)
            if self._queued.get(elector) != at:
                continue  # an entry superseded by an earlier one
            del self._queued[elector]
            elector.tick(now)
            if elector in self._busy:
                later.append((elector, min(elector.timers(), default=INFINITY)))
            elif elector.stopping:
                continue
            elif elector.due(now):
                due.append(elector)
            else:
                later.append((elector, elector.wake_at()))
        # Queued again only after the pass: a tick may leave a moment at or before ``now``
        # (a leader exactly at its half-lease mark: a gap of exactly half the lease is not
        # past it), and re-reading it at the same ``now`` would never end. The loop looks
        # again with the clock read anew, as the one loop per elector did.
        for elector, at in later:
            self._push(elector, at)
        return due

    def _dispatch(self, due: list[S]) -> None:
        """Renewals first, in one batch where the store allows; then each follower's step."""
        if not due:
            return
        steps = due
        if self._batching is not None:
            # (A lease whose lock a release holds renews on its own once the lock is free.)
            leaders = [e for e in due if e.may_renew()]
            if leaders:
                batched = set(leaders)
                steps = [e for e in due if e not in batched]
                for batch in self._batches(leaders):
                    self._start(self._batching.renew(batch), batch)
        for elector in steps:
            self._start(elector.step(), [elector])

    def _batches(self, leaders: list[S]) -> list[list[S]]:
        """The leases to renew now: those due, and every other lease led on its usual beat
        whose renewal is due within half a renew interval (so that the set's renewals come
        together), in batches of at most `MAX_BATCH`."""
        chosen = set(leaders)
        timing = leaders[0].timing
        horizon = self._clock.now() + timing.renew_interval / 2
        for elector in self.electors:
            if (
                elector not in chosen
                and elector not in self._busy
                and not elector.stopping
                and elector.may_renew()
                and elector.renews_by(horizon)
            ):
                leaders.append(elector)
                chosen.add(elector)
        return [leaders[i : i + MAX_BATCH] for i in range(0, len(leaders), MAX_BATCH)]

    def _start(self, work: Awaitable[object], electors: Sequence[S]) -> None:
        self._busy.update(electors)
        for elector in electors:
            # Its timers still run while it is out (rule 3): a lease whose deadline passes
            # during a batch demotes at the deadline — its transition, the demotion actions,
            # the gap alert — not when the batch answers or times out, a request timeout later.
            # (An elector taken from the heap as due has no entry left; one that joined a batch
            # early keeps its own, which `_pop_due` turns into its timers.)
            self._push(elector, min(elector.timers(), default=INFINITY))

        async def run() -> None:
            await work

        task = asyncio.create_task(run(), name="lease-step")
        self._work.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._work.discard(task)
            self._busy.difference_update(electors)
            if not task.cancelled() and task.exception() is not None:
                self._failure = task.exception()
                self._wake.set()
            for elector in electors:
                self._queued.pop(elector, None)  # its entry was for its timers only
                self._push(elector, elector.wake_at())
            self._wake.set()

        task.add_done_callback(done)
