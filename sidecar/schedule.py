"""One clock for every lease of a sidecar: the scheduler the electors run on.

One loop keeps every elector's next moment in one heap — its next attempt, its deadline and the
half-lease mark of its renewal gap (`Elector.wake_at`) — and at each moment does what the
elector's own loop used to do: the time-driven transitions (`Elector.tick`), then the step
that is due. A thousand leases are then one task and one timer, not a thousand of each.

Renewals that are due together go in one request where the store can renew many leases at
once (`RenewsMany`): every lease this replica leads whose renewal is due within half a renew
interval goes with the one that is due, so that after a round or two the leases renew in one
batch per renew interval. Each lease's outcome is applied to that lease exactly as its own
renewal's would be (`Elector.finish_renewal`): rule 1 per lease (the store checks holder and
term per lease), rule 3 per lease (its deadline counts from when the batch was *sent*, and an
answer after its deadline extends nothing). A store without a multi-object write (Kubernetes)
renews each lease with a request of its own, and so does a sidecar of one lease, exactly as
before batching.

Renewals first: at each moment the batch of due renewals starts before any follower's step,
and a follower's step (an acquire, a read, a loss marker) waits for the acquire slots
(`sidecar.lease_set.AcquireSlots`), never a renewal.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from sidecar.backends.base import (
    MAX_BATCH,
    LeaseRecord,
    Renewal,
    RenewalOutcome,
    RenewsMany,
    StoreError,
    StoreUnavailable,
)
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.elector import Elector, no_scheduler
from sidecar.status import Role

logger = logging.getLogger("sidecar.schedule")

INFINITY = float("inf")


class Batching:
    """How a set's renewals go in one request: the client that renews many, each elector's
    lease name at the store, and where the request is counted (once per batch)."""

    def __init__(
        self,
        client: RenewsMany,
        names: Mapping[Elector, str],
        count: Callable[[str, str, float], None],
    ) -> None:
        self.client = client
        self.names = dict(names)
        self.count = count
        self.batches = 0  # batches sent (tests, logs)


class Scheduler:
    """Runs ``electors`` until every one of them is stopped (`Elector.stop`), or until
    cancelled; raises what a step raised (a bug)."""

    def __init__(
        self,
        electors: Iterable[Elector],
        *,
        clock: Clock = SYSTEM_CLOCK,
        batching: Batching | None = None,
    ) -> None:
        self.electors = list(electors)
        self._clock = clock
        self._batching = batching
        self._heap: list[tuple[float, int, Elector]] = []
        self._queued: dict[Elector, float] = {}  # each elector's earliest live heap entry
        self._order = itertools.count()
        self._busy: set[Elector] = set()  # a step or a batch of theirs is in flight
        self._work: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._sleeping_until = -INFINITY  # while the loop runs, nobody needs to wake it
        self._watches: list[asyncio.Task[None] | Callable[[], None]] | None = None

    # -- what the electors tell it ----------------------------------------------------------

    def _push(self, elector: Elector, at: float) -> None:
        """Look at ``elector`` at ``at``, unless it is to be looked at sooner already."""
        if at == INFINITY or at >= self._queued.get(elector, INFINITY):
            return
        self._queued[elector] = at
        heapq.heappush(self._heap, (at, next(self._order), elector))
        if at < self._sleeping_until:
            self._wake.set()

    def _woken(self, elector: Elector) -> None:
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
                elector.wake_scheduler = no_scheduler

    def _pop_due(self, now: float) -> list[Elector]:
        """Every elector whose moment has come: its timers ticked, and those due for a step."""
        due: list[Elector] = []
        later: list[tuple[Elector, float]] = []
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

    def _dispatch(self, due: list[Elector]) -> None:
        """Renewals first, in one batch where the store allows; then each follower's step."""
        if not due:
            return
        steps = due
        if self._batching is not None:
            # (A lease whose lock a release holds renews on its own once the lock is free.)
            leaders = [e for e in due if e.role is Role.LEADER and not e.lock.locked()]
            if leaders:
                batched = set(leaders)
                steps = [e for e in due if e not in batched]
                for batch in self._batches(leaders):
                    self._start(self.renew(batch), batch)
        for elector in steps:
            self._start(elector.step(), [elector])

    def _batches(self, leaders: list[Elector]) -> list[list[Elector]]:
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
                and not elector.lock.locked()
                and elector.renews_by(horizon)
            ):
                leaders.append(elector)
                chosen.add(elector)
        return [leaders[i : i + MAX_BATCH] for i in range(0, len(leaders), MAX_BATCH)]

    def _start(self, work: Awaitable[object], electors: Sequence[Elector]) -> None:
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

    # -- a batch of renewals ----------------------------------------------------------------

    async def renew(self, electors: list[Elector]) -> None:
        """Renew ``electors`` in one request: each lease's lock is held from before the send
        until its outcome is applied, as for a renewal of its own."""
        assert self._batching is not None
        held: list[Elector] = []
        try:
            for elector in electors:
                await elector.lock.acquire()  # free (`_dispatch`), unless a release came first
                held.append(elector)
            now = self._clock.now()
            members = [(e, term) for e in held if (term := e.begin_renewal(now)) is not None]
            if not members:
                return
            names = self._batching.names
            renewals = [
                Renewal(names[e], e.identity, term, e.timing.lease_duration) for e, term in members
            ]
            sent = self._clock.now()  # rule 3: every deadline counts from here
            outcomes: Sequence[RenewalOutcome]
            failure: StoreError | None = None
            try:
                outcomes = await self._send(renewals, members[0][0].timing.request_timeout)
            except StoreError as failed:
                failure = failed
                outcomes = [failed] * len(members)
            # The store answered (an entry's own error says nothing of the others), or nothing
            # is known: the sidecar's one probe hears it once.
            probe = members[0][0].probe
            if probe is not None:
                if failure is None:
                    probe.answered()
                else:
                    probe.refused(failure)
            # One pass over the batch: each lease's outcome, as its own renewal's.
            for (elector, term), outcome in zip(members, outcomes, strict=True):
                elector.finish_renewal(sent, term, outcome, answered=failure is None)
        finally:
            for elector in held:
                elector.lock.release()

    async def _send(self, renewals: list[Renewal], timeout: float) -> list[RenewalOutcome]:
        """One `renew_many` request within ``timeout``, counted once. Raises `StoreUnavailable`
        when nothing is known about any entry."""
        assert self._batching is not None
        batching = self._batching
        batching.batches += 1
        started = self._clock.now()
        outcome = "ok"
        try:
            async with asyncio.timeout(timeout):
                answer = await batching.client.renew_many(renewals)
            if len(answer) != len(renewals):
                raise StoreUnavailable(
                    f"renew_many answered {len(answer)} outcomes for {len(renewals)} leases"
                )
            return [a if isinstance(a, (LeaseRecord, StoreError)) else _bad(a) for a in answer]
        except TimeoutError:
            outcome = "timeout"
            raise StoreUnavailable(f"renew_many timed out after {timeout:.3f}s") from None
        except StoreUnavailable:
            outcome = "unavailable"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:
            outcome = "error"
            logger.exception("unexpected store error", extra={"sidecar_fields": {"op": "renew"}})
            raise StoreUnavailable(f"renew_many: {type(exc).__name__}: {exc}") from exc
        finally:
            batching.count("renew", outcome, self._clock.now() - started)


def _bad(answer: object) -> StoreError:
    return StoreUnavailable(f"renew_many answered {type(answer).__name__}, not an outcome")
