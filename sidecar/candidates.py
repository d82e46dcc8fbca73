"""Who is alive to take leases: this replica's own candidate record, kept fresh, and what it
has observed of the others' (for balance, transfer, rolling updates).

Liveness is observed exactly like a lease (rule 2): another candidate counts as alive until
this replica has seen its record's *version* unchanged for a lease on its own monotonic clock
— and only once it has seen that version *change*: a record seen with one version
only may have been written once by anything (a hand edit, a replica that died after its first
beat), and handing it a lease would leave that lease unled for a lease. Until then it is
*pending*: never a successor, never counted in a share or a balance, only ranked among those
who try a free lease first (a preference that costs a stand-back, never a lease).
A record marked ``leaving`` (a replica shutting down) is never handed a lease. None of this is
a safety rule: a wrong view moves a lease more or less often, it never grants one — grants stay
conditional at the store and expiry stays observed per lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Callable
from datetime import datetime

from sidecar.backends.base import (
    Candidate,
    CandidateRegistry,
    ListsOnBeat,
    StoreError,
    StoreUnavailable,
)
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import Throttle, log
from sidecar.probe import StoreProbe

logger = logging.getLogger("sidecar.candidates")

# How many of its own beats a replica remembers: a leader may hand a lease over by a version
# it read a few beats ago (a view is current for 1.5 intervals, and a stream may bring it late).
BEATS_REMEMBERED = 8


@dataclasses.dataclass
class _Seen:
    record: Candidate
    since: float  # when this version was first seen (monotonic)
    beating: bool = False  # an earlier version of it was seen: its writer beats


class CandidateView:
    """What this replica has seen of the candidate records. Pure bookkeeping, no I/O."""

    def __init__(self, me: Candidate, alive_for: float) -> None:
        self.me = me
        self.alive_for = alive_for  # a record whose version stood still this long is dead
        self._seen: dict[str, _Seen] = {}
        self.listed = False  # the registry answered at least once

    def observe(self, records: list[Candidate], at: float) -> None:
        self.listed = True
        current = {record.identity: record for record in records}
        for identity in list(self._seen):
            if identity not in current:
                del self._seen[identity]  # left, or garbage-collected
        for identity, record in current.items():
            seen = self._seen.get(identity)
            if seen is None:
                self._seen[identity] = _Seen(record, at)
            elif seen.record.version != record.version:
                self._seen[identity] = _Seen(record, at, beating=True)
            else:
                seen.record = record

    def live(self, now: float) -> list[Candidate]:
        """Every candidate alive as observed — its version seen to change, and then not
        standing still for ``alive_for`` — this replica included (unless it is leaving),
        sorted by identity so that every replica plans over the same order."""
        alive = {
            identity: seen.record
            for identity, seen in self._seen.items()
            if seen.beating and now - seen.since < self.alive_for and not seen.record.leaving
        }
        alive.pop(self.me.identity, None)
        if not self.me.leaving:
            alive[self.me.identity] = self.me
        return [alive[identity] for identity in sorted(alive)]

    def pending(self, now: float) -> list[Candidate]:
        """Candidates seen with one version only, within ``alive_for`` of it (not leaving, not
        this replica): maybe a replica that just started, maybe a record written once."""
        return [
            seen.record
            for identity, seen in sorted(self._seen.items())
            if not seen.beating
            and now - seen.since < self.alive_for
            and not seen.record.leaving
            and identity != self.me.identity
        ]

    def version_of(self, identity: str) -> str | None:
        """The version of ``identity``'s record as last seen."""
        seen = self._seen.get(identity)
        return seen.record.version if seen is not None else None

    def all(self) -> list[Candidate]:
        return [seen.record for _, seen in sorted(self._seen.items())]


def _outcome(exc: BaseException) -> str:
    return "timeout" if isinstance(exc, TimeoutError) else "unavailable"


def successor_order(me: Candidate) -> Callable[[Candidate], tuple[int, int, datetime, str]]:
    """Sort key, best successor last: higher ``--priority`` first; then a replica of another
    revision than ours (in a rolling update the terminating replica is the old revision, so
    the others' revision is the new one); then the most recently started; then identity."""
    floor = datetime.min.replace(tzinfo=None)

    def key(candidate: Candidate) -> tuple[int, int, datetime, str]:
        other_revision = bool(candidate.revision) and candidate.revision != me.revision
        started = candidate.started_at.replace(tzinfo=None) if candidate.started_at else floor
        return (candidate.priority, int(other_revision), started, candidate.identity)

    return key


class CandidateBeat:
    """Writes this replica's candidate record every renew interval and reads everyone's.
    Store errors are logged (throttled) and retried; they never touch leadership."""

    def __init__(
        self,
        registry: CandidateRegistry,
        view: CandidateView,
        lease_duration: float,
        interval: float,
        request_timeout: float,
        *,
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[], None] = lambda: None,
        needs_list: Callable[[], bool] = lambda: True,
        count: Callable[[str, str, float], None] = lambda op, outcome, seconds: None,
        versions_fresh_for: float = float("inf"),
        on_bad: Callable[[Candidate], None] = lambda candidate: None,
    ) -> None:
        self.registry = registry
        # Told of each record that cannot be read (left out) or has a field that cannot,
        # once per version (`sidecar.backends.records`): the sidecar logs and counts it.
        self._on_bad = on_bad
        self._reported: set[tuple[str, str]] = set()
        # Whether the periodic beat also reads everyone's records (with one lease only the
        # leader needs them, and it reads them again before any hand-over anyway).
        self._needs_list = needs_list
        self._count = count  # store requests, into the sidecar's own metrics
        self.view = view
        self.lease_duration = lease_duration
        self.interval = interval
        self.request_timeout = request_timeout
        # How long after a read its versions stay young enough to hand a lease over by
        # (`versions_fresh`).
        self.versions_fresh_for = versions_fresh_for
        self._clock = clock
        self._on_change = on_change
        self._throttle = Throttle()
        self._wake = asyncio.Event()
        self.listed_at = float("-inf")  # when the others' records were last read
        self.answered_at = float("-inf")  # when the store last answered a candidate request
        # Every read, every stream notice and every list a stream brings takes the next number
        # when it begins: a read's answer older than what the view already holds is dropped,
        # and the view is current only once a read begun after the last notice was applied.
        self._numbered = 0
        self._applied = 0  # the number of what the view holds
        self._noticed = 0  # the number of the last notice that asks for a read
        self._read_soon = asyncio.Event()
        self._streamed_at = float("-inf")  # when the stream last brought every record
        self._needs_changed = asyncio.Event()  # `needs_list` may have changed (`wake_follow`)
        self._sent: dict[str, float] = {}  # our last versions, oldest first → when sent
        self._probe: StoreProbe | None = None
        self._shutting_down = False  # `leaving`: for good, whatever the app does next

    def use_probe(self, probe: StoreProbe) -> None:
        """While the store refuses, beat only once ``probe`` finds it answering again (and
        never before its ``Retry-After``); tell it how each request went."""
        self._probe = probe

    def _answered(self) -> None:
        self.answered_at = self._clock.now()
        if self._probe is not None:
            self._probe.answered()

    def _refused(self, exc: BaseException) -> None:
        if self._probe is not None:
            self._probe.refused(
                exc if isinstance(exc, StoreError) else StoreUnavailable(str(exc) or "timed out")
            )

    def sent_at(self, version: str) -> float | None:
        """When this replica sent the beat that wrote ``version`` of its record (monotonic),
        if it was one of its last `BEATS_REMEMBERED`: a grant handed over by that version
        counts from there (`sidecar.elector`)."""
        return self._sent.get(version)

    async def once(self) -> bool:
        """One beat and (when needed) one listing. True when they answered."""
        started = self._clock.now()
        # A version of our own, remembered with the moment before it was sent: whoever reads
        # it (and hands us a lease by it) read it after that moment.
        version = str(1 + secrets.randbits(62))
        self._sent[version] = started
        while len(self._sent) > BEATS_REMEMBERED:
            del self._sent[next(iter(self._sent))]
        me = dataclasses.replace(self.view.me, version=version)
        registry = self.registry
        # The group is read at every beat (unless a stream brings every record): in the same
        # request where the store can, so that a replica sends one request per beat, not two.
        listing = (
            self._needs_list()
            and not (self.current() and self._streams_records())
            and isinstance(registry, ListsOnBeat)
        )
        number = self._next_number() if listing else 0
        records: list[Candidate] = []
        try:
            async with asyncio.timeout(self.request_timeout):
                if listing:
                    assert isinstance(registry, ListsOnBeat)
                    records = await registry.beat_and_list(me, self.lease_duration)
                else:
                    await registry.beat(me, self.lease_duration)
        except (StoreError, TimeoutError) as exc:
            self._count("candidate_beat", _outcome(exc), self._clock.now() - started)
            self._failed(exc)
            self._refused(exc)
            return False
        self._count("candidate_beat", "ok", self._clock.now() - started)
        self._answered()
        if listing:
            if number > self._applied:  # else the view already holds something newer
                self._applied = number
                self._observe(records)
            return True
        if not self._needs_list():
            return True
        if self.current() and self._streams_records():
            # The stream brings every record, beats included (Kubernetes): nothing to read,
            # but the sidecar hears from the group every beat as it would from a read.
            self._on_change()
            return True
        return await self.refresh(self.request_timeout)

    async def refresh(self, timeout: float) -> bool:
        """One listing: the others' records as they are now. True when it answered."""
        started = self._clock.now()
        number = self._next_number()
        try:
            async with asyncio.timeout(timeout):
                records = await self.registry.list()
        except (StoreError, TimeoutError) as exc:
            self._count("candidate_list", _outcome(exc), self._clock.now() - started)
            self._failed(exc)
            self._refused(exc)
            return False
        self._count("candidate_list", "ok", self._clock.now() - started)
        self._answered()
        if number > self._applied:  # else the view already holds something newer
            self._applied = number
            self._observe(records)
        return True

    def _next_number(self) -> int:
        self._numbered += 1
        return self._numbered

    def _observe(self, records: list[Candidate], *, quiet: bool = False) -> None:
        """``quiet``: tell the sidecar only if the live set changed (a stream that brings
        every beat of every replica must not wake a thousand electors each time)."""
        now = self._clock.now()
        before = [c.identity for c in self.view.live(now)]
        self.view.observe(self._readable(records), now)
        self.listed_at = now
        after = [c.identity for c in self.view.live(now)]
        if before != after:
            log(logger, "info", "candidates changed", live=len(after), candidates=after)
        if before != after or not quiet:
            self._on_change()

    def _readable(self, records: list[Candidate]) -> list[Candidate]:
        """The records to judge by: one that cannot be read is left out, and each bad one is
        reported once per version."""
        reported = set()
        for record in records:
            if record.unreadable is not None or record.ignored is not None:
                key = (record.identity, record.version)
                if key not in self._reported:
                    self._on_bad(record)
                reported.add(key)
        self._reported = reported  # what the store holds now: bounded by the group
        return [record for record in records if record.unreadable is None]

    def current(self) -> bool:
        """The view holds every change of the group so far: its change stream is connected,
        a read begun after its last notice was applied, and the records were read within
        about a beat (liveness is judged from versions seen changing, and a stream may tell
        only joins and leaves). A hand-over then needs no read first."""
        return (
            self.registry.following()
            and self._applied >= self._noticed
            and self._clock.now() - self.listed_at < 1.5 * self.interval
        )

    def versions_fresh(self) -> bool:
        """A hand-over may name the versions in the view: the successor leads on the grant
        only if the beat that wrote that version is recent enough (`Timing.handed_reach`),
        else it writes a grant of its own — a round trip and a term more. A stream that brings
        every record (Kubernetes) keeps each version at most a beat old. A stream of notices
        only (Redis, memory) tells joins, leaves and marks, not beats: the versions are those
        of the last read, each written up to a beat before it, so once that read is
        `versions_fresh_for` old a hand-over reads first (about a quarter of the hand-overs
        fell back to a write before)."""
        return (
            self._streams_records() or self._clock.now() - self.listed_at < self.versions_fresh_for
        )

    def _streams_records(self) -> bool:
        """The change stream brought every record within about a beat (Kubernetes)."""
        return self._clock.now() - self._streamed_at < 1.5 * self.interval

    def wake_follow(self) -> None:
        """This replica's need for the group may have changed (it became or stopped being a
        leader): `follow` starts or stops the stream accordingly."""
        self._needs_changed.set()

    async def follow(self) -> None:
        """Keep the view current from the registry's change notices while this replica needs
        the group (`needs_list`: a leader, or every replica with several leases; a follower of
        one lease would only pay for a stream it never uses, and on Kubernetes every beat of
        every replica is an event). Runs until cancelled, or ends when the store cannot follow
        its group (`current` then stays false)."""
        while True:
            while not self._needs_list():
                self._needs_changed.clear()
                await self._needs_changed.wait()
            stream = asyncio.create_task(self._follow_stream(), name="candidates-stream")
            try:
                while self._needs_list() and not stream.done():
                    self._needs_changed.clear()
                    changed = asyncio.create_task(self._needs_changed.wait())
                    await asyncio.wait({stream, changed}, return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
            finally:
                stream.cancel()
                await asyncio.gather(stream, return_exceptions=True)
            if stream.done() and not stream.cancelled():
                if stream.exception() is not None:
                    raise stream.exception()  # type: ignore[misc]  # (a bug: restarted)
                return  # the store cannot follow its group

    async def _follow_stream(self) -> None:
        reader = asyncio.create_task(self._read_notices(), name="candidates-read")
        try:
            async for notice in self.registry.changes():
                if reader.done():
                    reader.result()  # the reader failed (a bug): fail the stream with it
                number = self._next_number()
                if notice is None:
                    self._noticed = number
                    self._read_soon.set()
                else:  # every record, newer than any read still in flight
                    self._applied = number
                    self._observe(notice, quiet=True)
                    self._streamed_at = self._clock.now()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_notices(self) -> None:
        """One read per batch of notices; one that fails leaves the view not current until a
        later read (the next notice's, or the next beat's) answers."""
        while True:
            await self._read_soon.wait()
            self._read_soon.clear()
            await self.refresh(self.request_timeout)

    def _failed(self, exc: BaseException) -> None:
        if self._throttle.allow():
            log(
                logger,
                "warning",
                "could not refresh the candidate records; leases stay as they are",
                error=str(exc) or type(exc).__name__,
                suppressed=self._throttle.take_suppressed(),
            )

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._store_answers()
            await self.once()
            self._wake.clear()
            try:
                async with asyncio.timeout(self.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _store_answers(self) -> None:
        """While the store refuses, wait for the sidecar's probe (the beat says nothing anyone
        could read meanwhile), and never beat before the store's ``Retry-After``."""
        probe = self._probe
        if probe is None:
            return
        await probe.wait()
        wait = probe.wait_after(self._clock.now())
        if wait > 0:
            await asyncio.sleep(wait)

    def leaving(self) -> None:
        """From now on this replica is leaving: it hands itself no lease, and a beat still in
        flight writes the mark (the record is removed next, `remove`)."""
        self._shutting_down = True
        self.view.me = dataclasses.replace(self.view.me, leaving=True)

    def app_is(self, up: bool) -> None:
        """The app beside this replica came up or went down (`sidecar.app_check`): say so at
        once. An app that is down marks the record ``leaving`` too, so that no replica — of
        this version or an older one — hands this replica a lease, counts it in a share or
        picks it for ``transfer --to any``; the mark goes again when the app is back (unless
        the replica is shutting down)."""
        self.view.me = dataclasses.replace(
            self.view.me, app="up" if up else "down", leaving=self._shutting_down or not up
        )
        self.wake()

    async def remove(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(max(0.01, timeout)):
                await self.registry.leave(self.view.me.identity)
        except (StoreError, TimeoutError):
            pass
