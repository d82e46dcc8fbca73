"""The contract every lease store implements.

The elector imports this module and nothing else from `sidecar.backends`. A store keeps one
lease record and does exactly two kinds of thing: it *reports* what it holds, and it *writes*
conditionally, atomically, at the store (rule 1). It never decides that a lease has expired:
expiry is observed by the elector on its own monotonic clock, the same way for every store
(rule 2, `sidecar.observed`). A store's TTLs and timestamps are garbage collection and
information for humans; they never grant.

* ``try_acquire`` grants the lease only if the store still holds *exactly* the record the
  caller names by ``expected`` version (``None``: no record at all) — the version the caller
  has watched unchanged for a lease, or a release, or its own name — with
  ``term = max(stored term, min_term) + 1`` in the same write (rules 1 and 5). Otherwise it
  writes nothing and raises `LeaseHeld` (or `Conflict`) with what it holds now.
* ``renew`` extends the caller's grant while ``holder`` and ``term`` are still the caller's.
  If the store holds no record, or only one with a *lower* term (it lost state: a restart
  without persistence, a failover to a replica that missed writes, a deleted record, a Redis
  key that expired when the Redis host's clock stepped), it puts the caller's grant back and
  raises its term to it: a holder the store forgot keeps its lease, and its term stays used
  (rule 5). Anything else (a later grant, someone else's record at the caller's term, a
  release) changes nothing and raises `NotOwned`.
* ``release`` frees the caller's grant (keeping the term) while ``holder`` and ``term`` are
  still the caller's, and marks the record *released*: free at once for everyone; otherwise
  it changes nothing and raises `NotOwned` (rule 1).
  ``release`` may name a ``successor`` identity: the released record carries it, so the others
  stand back briefly and the named replica takes over (a transfer). The successor is a
  preference for liveness only; the record is free for everyone (rule 2).
* ``hand_over`` is a release that grants in the same write: while ``identity`` still holds
  the lease with ``term``, the lease goes to ``successor`` with ``term = max(stored term,
  min_term) + 1`` (rules 1 and 5), and the record carries ``handed``: the version of the
  successor's candidate record the releasing holder chose it by. The successor leads without
  a write of its own, counting its lease from when it sent that candidate record (which was
  before this write, so it stops before anyone may take the lease: `sidecar.elector`). Its
  first renewal clears ``handed``. A store that cannot make the successor sure the write
  holds (Redis with ``WAIT``) says so in ``hands_over`` and is released to instead.
* ``mark_lost`` writes down a loss a follower saw (the store holds no record at all, or a
  record of a lower term, where it had shown a term): a *loss marker* with no holder, not
  released, carrying the highest term the follower saw. Every replica waits it out as a loss
  and jumps its next grant above it, also one that starts after the loss and never saw the
  lease (rules 5 and 8); the holder the store forgot puts its grant back over it as over
  nothing. It only ever goes where the store holds nothing or a record of a lower term (a
  grant, a release or a marker), never over an operator's hold.
* Every version is new on every write and never comes back (a random token, or Kubernetes'
  resourceVersion), so "the same version" means "nothing was written in between".
* A `StoreClient` that can renew many leases in one round trip also implements
  `RenewsMany` (``renew_many``): each lease's outcome exactly as its own ``renew`` would
  answer, in one request. A store without a multi-object write (Kubernetes) does not, and its
  leases renew one request each (`RenewsEach`, which the sidecar puts over ``renew``).

Every call either returns a `LeaseRecord` or raises one of the exceptions below; no call answers
a bare ``False`` that throws the reason away. Calls may block for at most the store's request
timeout; the elector wraps each call in its own deadline as well.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

# The holder name a loss marker is stored under where a store has no other way to say "no
# holder, not released" (SQLite, Kubernetes). Never an identity: those are pod names (no '/')
# with a suffix. A sidecar from before loss markers reads it as a held lease and waits it out.
LOST_HOLDER = "leader-sidecar.io/lost"


# The holder name of an operator's hold (``leader-sidecar hold``): a grant like any other, with
# a term of its own, that no sidecar leads on; followers wait it out like any held lease (its
# duration is the hold's). Written as ``leader-sidecar.io/hold by WHO: REASON`` (`hold_holder`).
HOLD_HOLDER = "leader-sidecar.io/hold"


def is_hold(holder: str | None) -> bool:
    """The holder is an operator's hold, not a replica."""
    return holder is not None and (holder == HOLD_HOLDER or holder.startswith(HOLD_HOLDER + " "))


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One observation of the lease: the only type that crosses the backend boundary."""

    holder: str | None
    """Identity holding the lease, or None when it was released (or never taken)."""

    term: int
    """Fencing token of the latest grant. Kept when the lease is released."""

    duration: float
    """Lease duration in seconds, as written by the holder."""

    version: str
    """Opaque and new on every write (see the module docstring). A record the store only
    partly remembers (Redis: a term counter without a holder key) has a version of its own."""

    released: bool = False
    """True when the holder is None because of an explicit release: free at once. A record
    with no holder that is *not* released (the store lost the holder: `forgotten`) is waited
    out as a loss."""

    successor: str | None = None
    """Set only on a released record: the identity the releasing holder handed the lease to
    (a transfer, a rolling update). Others stand back briefly so that one wins the race; it is
    never a reason to refuse anyone a grant (the record is free)."""

    handed: str | None = None
    """Set only on a grant a hand-over wrote, until its holder renews: the version of the
    holder's candidate record that the releasing holder handed it the lease by."""

    acquired_at: datetime | None = None
    """Wall-clock time of the grant, for humans only."""

    renewed_at: datetime | None = None
    """Wall-clock time of the last renewal, for humans only."""

    unreadable: str | None = None
    """Why the stored record could not be read (`sidecar.backends.records`), or None. Such a
    record is one of *unknown holder*: ``holder`` None, not released, ``term`` 0 — never free,
    never forgotten, never a grant to put back; waited out as a loss and taken over only by a
    conditional write on its ``version``."""

    ignored: str | None = None
    """A field for humans that could not be read and reads as None (a timestamp), or None.
    The record stays readable; the reader reports it like an unreadable one."""

    @property
    def free(self) -> bool:
        """True when anyone may take the lease now: it was released."""
        return self.holder is None and self.released

    @property
    def forgotten(self) -> bool:
        """No holder and not released: the store lost the holder (a loss marker, or a Redis
        term counter without its holder key). A loss to everyone who sees it."""
        return self.holder is None and not self.released and self.unreadable is None


def lost_grant(record: LeaseRecord | None, term: int) -> bool:
    """What a store shows when it lost a grant of ``term``: no record, an older term, or that
    term with no holder that nobody released (a loss marker, a Redis key gone early). Nobody
    took the lease from its holder, who puts the grant back. Never a record that cannot be
    read: whose it is, is not known."""
    if record is not None and record.unreadable is not None:
        return False
    if record is None or record.term < term:
        return True
    return record.term == term and record.forgotten


def room_for_marker(record: LeaseRecord | None, term: int) -> bool:
    """Where ``mark_lost`` may write a marker of ``term``: the store holds nothing, or a
    record below it — a loss marker, a release or a grant; never an operator's hold (it
    leads nothing, so its term fences nothing, and it must stay until lifted), nor a record
    that cannot be read (a newer sidecar's, or damaged: waited out, then taken over).

    A grant or a release below a term seen is a count that started again after a loss
    nobody wrote down in time: left alone, its holder retaking its own grant, a hand-over
    between replicas that saw only that count, or a release taken again would climb, one
    term at a time, to a term already granted to another identity — which a fence accepts
    twice. Its holder's token is below one its fence has seen, so it could not write anyway:
    the marker costs it nothing but the lease, waited out before anyone takes it at a term
    above every one seen."""
    if record is None:
        return True
    readable = record.unreadable is None
    return readable and record.term < term and not is_hold(record.holder)


class StoreError(Exception):
    """Base of every error a store raises."""


class StoreUnavailable(StoreError):
    """The store could not be reached or did not answer in time; nothing is known.

    ``retry_after``: seconds the store asked us to wait before the next request (an HTTP
    ``Retry-After`` on a 429 or 5xx), or None. Every retry honours it where the caller's own
    deadline allows (a renewal never waits past its deadline: rule 3)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NoStore(StoreError):
    """A read-only client (``leader-sidecar status``) found no store where it was pointed: a
    reader must not create one, and "nothing held" would be a confidently wrong answer."""


class _WithRecord(StoreError):
    def __init__(self, message: str, record: LeaseRecord | None) -> None:
        super().__init__(message)
        self.record = record


class TermExhausted(StoreUnavailable):
    """The next term would pass what the store can hold (`sidecar.backends.records.MAX_TERM`;
    an int32 on Kubernetes): nothing was written. Terms never go back (rule 5), so the lease
    cannot be granted again until an operator intervenes; the message says how."""


class LeaseHeld(_WithRecord):
    """``try_acquire`` found another holder's unexpired lease; ``record`` is what it found."""


class NotOwned(_WithRecord):
    """``renew``/``release`` found a record that is not the caller's (other holder, other term,
    or no record); nothing was changed. ``record`` is what was found, if known."""


class Conflict(_WithRecord):
    """A compare-and-swap lost a race with another writer (Kubernetes 409). The store re-read
    the record; ``record`` is the fresh one, if the re-read succeeded."""


@runtime_checkable
class LeaseStore(Protocol):
    """One lease in one store. Construct with the lease's name; see module docstring."""

    @property
    def description(self) -> str:
        """Where the lease lives, for logs: ``sqlite:///x.db lease=default``."""
        ...

    async def read(self) -> LeaseRecord | None:
        """The current record, or None if the store holds none."""
        ...

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        """Grant the lease to ``identity`` if the store holds exactly the record of version
        ``expected`` (None: no record at all), with ``term = max(stored term, min_term) + 1``.
        Otherwise write nothing and raise `LeaseHeld` with the record it holds. Raises
        `LeaseHeld`, `Conflict` or `StoreUnavailable`."""
        ...

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        """Extend the lease by ``duration`` if ``identity`` still holds it with ``term``; put
        the grant back if the store lost it (no record, or a lower term). Raises `NotOwned`,
        `Conflict` or `StoreUnavailable`."""
        ...

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        """Free the lease (keeping its term; the record says *released*, and names
        ``successor`` if given) if ``identity`` still holds it with ``term``. Raises
        `NotOwned`, `Conflict` or `StoreUnavailable`."""
        ...

    @property
    def hands_over(self) -> bool:
        """Whether `hand_over` may be used (see the module docstring)."""
        ...

    async def hand_over(
        self,
        identity: str,
        term: int,
        *,
        successor: str,
        handed: str,
        duration: float,
        min_term: int,
    ) -> LeaseRecord:
        """Grant the lease to ``successor`` (lease ``duration``, ``term = max(stored term,
        min_term) + 1``, the record carrying ``handed``) if ``identity`` still holds it with
        ``term``. Raises `NotOwned`, `Conflict` or `StoreUnavailable`."""
        ...

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        """Write a loss marker of ``term`` (lease ``duration``) if the store holds no record at
        all or a record of a lower term that is no hold (`room_for_marker`); otherwise write
        nothing. Returns what the store
        holds afterwards. Raises `StoreUnavailable`."""
        ...

    def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield the record soon after it changes — on every write, renewals included, so
        followers see each new version promptly — and once after every (re)connection.
        Duplicates and coalescing are allowed; every yield means "something may have
        changed". Runs until cancelled and reconnects on its own; never raises `StoreError`."""
        ...

    async def close(self) -> None:
        """Release what this lease alone holds (its watch). The lease itself is left as it
        is; the `StoreClient` it came from owns the connections."""
        ...


@runtime_checkable
class FollowsByCall(Protocol):
    """A `LeaseStore` whose watch can call a function instead of being iterated: a sidecar of
    1,000 leases then needs no task, event and generator per lease to follow them.

    ``follow(callback)`` calls ``callback(record)`` exactly where ``watch()`` would yield it
    (same records, same moments: after every change, once after every (re)connection;
    duplicates and coalescing allowed), on the event loop, never twice at once, until the
    function it returns is called. The callback must not block. One that raises is a bug: the
    store's shared watch task fails and is restarted by its supervisor (every follower of the
    client is then called anew with its record)."""

    def follow(self, callback: Callable[[LeaseRecord | None], None]) -> Callable[[], None]:
        """Start calling ``callback``; the function returned stops it."""
        ...


# -- candidates: who is alive to take leases (balance, transfer, rolling updates) -----------


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One replica's candidate record: written by itself every renew interval, with a new
    ``version`` on every write. Liveness is *observed* exactly like a lease (rule 2): a record
    whose version stayed the same for a lease on the reader's own clock is dead; a store's
    timestamps are for humans and garbage collection only."""

    identity: str
    version: str
    """New on every beat. The replica makes it (a decimal number, so that every store keeps
    it as it is) and remembers when it sent it: a hand-over names the version it chose the
    successor by, and the successor counts its lease from that beat."""
    revision: str = ""
    """The replica's revision (Kubernetes: the pod-template-hash label); "" when unknown."""
    priority: int = 0
    """Higher is preferred as a successor (``--priority``)."""
    leaving: bool = False
    """Set by a replica that is shutting down, or whose app is down: never hand it a lease."""
    started_at: datetime | None = None
    """Wall-clock start of the replica: among equals, the newest is preferred (rollouts)."""
    beat_at: datetime | None = None
    """Wall-clock time of the last write, for humans (``status``) and garbage collection."""
    unreadable: str | None = None
    """Why the stored record could not be read (`sidecar.backends.records`), or None. Such a
    record is marked ``leaving`` too, and left out by every reader."""
    ignored: str | None = None
    """A timestamp that could not be read and reads as None; the record stays readable."""
    app: str = ""
    """The replica's app as its sidecar checks it: "up", "down", or "" (no app check, or a
    store that keeps no such field). An app that is down also sets ``leaving``, so that a
    replica of any version skips it as a successor."""


@runtime_checkable
class CandidateRegistry(Protocol):
    """The candidates of one group of leases (one sidecar's set), in one store."""

    async def beat(self, candidate: Candidate, duration: float) -> None:
        """Write ``candidate`` (its identity's record only) with its version, exactly as
        given (a store makes one only when it is empty). ``duration`` is the lease: the store
        may garbage-collect records not written for many of them.
        Raises `StoreUnavailable`."""
        ...

    async def list(self) -> list[Candidate]:
        """Every candidate record the store holds (dead ones too: the reader judges).
        Raises `StoreUnavailable`."""
        ...

    async def leave(self, identity: str) -> None:
        """Remove ``identity``'s record (a graceful exit). Raises `StoreUnavailable`."""
        ...

    def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """The group's changes as they happen, until cancelled: a replica joined, left, or
        changed its revision, priority or leaving mark. ``None``: read the records (yielded
        first, and again whenever the stream reconnects); a list: every record as it is now.
        Never raises. A store that cannot follow its group ends at once: the sidecar then
        reads the group before every hand-over."""
        ...

    def following(self) -> bool:
        """True while `changes` is connected, so that no change it reports goes unseen."""
        ...


@runtime_checkable
class ListsOnBeat(Protocol):
    """A `CandidateRegistry` that writes a beat and reads the group in one request:
    with several leases a replica beats and reads the group every renew interval, and as two
    requests they were two of every three it sent, batched renewals being the third.

    ``beat_and_list(candidate, duration)`` is `CandidateRegistry.beat` then
    `CandidateRegistry.list`, in one round trip: every record the store holds once the beat
    is written (this replica's included). One atomic step where the store has one (SQLite,
    Redis); ZooKeeper, whose ``multi`` cannot read, sends the write and the read back to back
    on one session, which the server handles in that order. Raises `StoreUnavailable`."""

    async def beat_and_list(self, candidate: Candidate, duration: float) -> list[Candidate]:
        """Write ``candidate``'s beat and read every record of the group (see the class)."""
        ...


@runtime_checkable
class StoreClient(Protocol):
    """One connection to one store, shared by every lease a sidecar holds (1,000 leases
    must not mean 1,000 connections, pollers or watch streams)."""

    @property
    def description(self) -> str:
        """Where the leases live, for logs, without secrets: ``sqlite:///x.db``."""
        ...

    def lease(self, name: str) -> LeaseStore:
        """The store of the lease ``name``; cheap, no I/O until used."""
        ...

    def candidates(self, group: str) -> CandidateRegistry:
        """The candidate registry of ``group``."""
        ...

    async def close(self) -> None:
        """Close connections, threads and shared watches."""
        ...


# -- many renewals in one round trip ---------------------------------------------------------

MAX_BATCH = 1000
"""The most renewals a caller puts in one `RenewsMany.renew_many` call (it splits larger sets)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Renewal:
    """One lease of a batch: the arguments of ``client.lease(name).renew(identity, term,
    duration)``."""

    name: str
    """The lease's name, exactly as given to `StoreClient.lease`."""
    identity: str
    term: int
    duration: float


RenewalOutcome = LeaseRecord | StoreError
"""One entry of `RenewsMany.renew_many`'s answer: the record, or the error, of that lease."""


@runtime_checkable
class RenewsMany(Protocol):
    """A `StoreClient` that renews many of its leases in one conditional round trip.

    ``renew_many(renewals)`` is ``renew`` for each entry, in one request to the store:

    * **One step.** SQLite: one transaction. Redis: one script over every lease's keys.
      PostgreSQL: one statement (e.g. ``UPDATE … FROM unnest(…)`` with the restore and the
      read of what is there in CTEs). etcd: one ``Txn`` whose ``Then`` holds one nested
      ``Txn`` per lease (etcd ≥ 3.3) — a flat ``Txn``'s compares are all-or-nothing, and the
      entries must not be (below). ZooKeeper: one ``multi`` of a versioned ``setData`` per
      lease; a ``multi`` *is* all-or-nothing, so the lease whose write failed answers on its
      own and the others go again. A store that cannot do this does not implement the
      protocol; the caller then renews each lease with its own request.
    * **Each entry exactly as its own ``renew``** would have answered at that moment, checked
      and written atomically at the store per lease (rule 1): the renewed record (a new
      version, ``handed`` cleared, holder and term kept); or the grant *put back* where the
      store lost it (`lost_grant`: no record, a lower term, or a loss marker of that term),
      with the store's term raised to it; or a `NotOwned` carrying the record found (another
      holder, a later term, a release), nothing written for that lease; or `Conflict` where
      that lease's compare-and-swap lost a race; or a `StoreUnavailable` for that lease alone
      (a value in its key the store cannot decode). Errors are *returned* in the entry's
      place, never raised.
    * **Independent entries.** One lease's outcome never changes another's: a lease taken
      over, released or unreadable does not stop the others from renewing (no
      all-or-nothing), and the answer has one entry per renewal, in the same order.
    * **Seen like single renewals.** Every renewed lease's watch reports its new version
      (published, polled, streamed) as it would after ``renew``, so followers time it (rule 2).
    * **Raises `StoreUnavailable`** — and nothing else — when nothing is known about any
      entry: not sent, no answer, the store's request timeout passed, the Sentinels switched
      master during the request, or (Redis ``--redis-min-replicas``) ``WAIT`` counted too few
      replicas, so that none of the batch's writes counts (as for one renewal). The caller
      times each lease's deadline from when it *sent* the batch (rule 3) and applies no
      answer that arrives after a lease's deadline.
    * ``renewals`` names each lease at most once (the caller makes sure) and holds at most
      `MAX_BATCH` entries; an empty batch answers ``[]`` without a request. Blocks for at most
      the store's request timeout, like any call.
    """

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """Renew every lease of ``renewals`` in one request (see the class)."""
        ...


class RenewsEach:
    """`RenewsMany` for leases that renew with a request each (a store without a multi-object
    write, Kubernetes; a lease renewing on its own): every entry is its own ``renew`` on
    ``lease(name)``, one after another, so a batch of one is exactly its ``renew`` — the
    same request, the same error. Raises `StoreUnavailable` only when every entry did:
    nothing is known of any."""

    __slots__ = ("_lease",)

    def __init__(self, lease: Callable[[str], LeaseStore]) -> None:
        self._lease = lease

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        outcomes: list[RenewalOutcome] = []
        for renewal in renewals:
            store = self._lease(renewal.name)
            try:
                outcomes.append(await store.renew(renewal.identity, renewal.term, renewal.duration))
            except StoreError as failed:
                outcomes.append(failed)
        unavailable = [outcome for outcome in outcomes if isinstance(outcome, StoreUnavailable)]
        if unavailable and len(unavailable) == len(outcomes):
            raise unavailable[0]
        return outcomes
