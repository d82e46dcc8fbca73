"""What one replica has seen of the lease, and when it may try to take it (rules 2, 5 and 8).

This is the one place where expiry is decided, the same way for every store:

* **Observed expiry (rule 2).** A record held by someone else is expired only after this
  replica has seen the *same version* unchanged for the record's lease duration on its own
  monotonic clock. A store's TTLs and timestamps are never read. Every version is new on every
  write, so "unchanged" means "nobody wrote in between"; a new version restarts the count.
* **Free at once:** a record an explicit release wrote (when it names a successor, the others
  stand back ``stand_back`` seconds from when they saw it, so the named replica wins the race;
  a preference for liveness, never a condition of safety); a store that holds nothing at all and
  never showed this replica a term (a new lease); and a record that names *this* replica as
  holder while it is not leading (a late renewal the store applied after the deadline): taking
  that one back under a new term cannot make two leaders.
* **A store that lost state is waited out, every time (rule 8).** When the store shows less
  than this replica has seen — no record, a lower term, the highest term seen granted to
  another holder than the one it saw at that term or granted after it saw that term released,
  a hand-over's grant not above every term seen before it (terms are unique and a release ends
  its term, so a grant was forgotten and its term granted again) — or a record whose holder it
  lost (a
  loss marker, which a replica that saw the loss writes down for those that did not), the
  holder it forgot may still lead until its own deadline, at most one lease away. The wait is
  one full lease from *this* loss: a new loss (the store changed again, or the watch
  reconnected to a store that still shows the loss) starts a new wait, and the loss episode
  ends as soon as the store shows a grant or a release as new as any seen.
* **A record that cannot be read is a loss** (`sidecar.backends.records`: a hand edit, a
  restored backup, a writer that is not a sidecar of this version). Its holder is unknown, so
  it is never free and never taken over blindly: it is waited out one full lease from when it
  was first seen (a new version of it starts the wait again), then taken only through a
  conditional write on its version, with a term ``LOSS_TERM_GAP`` above every term seen —
  its own term is unknown (one past what the store can hold is not a term at all) and is
  never remembered as the highest seen.
* **Unique terms across losses (rule 5).** A grant after a loss asks for a term
  ``LOSS_TERM_GAP`` times the losses in a row above every term seen, so it cannot reuse the
  term of a grant the store forgot before this replica saw it (fewer than ``LOSS_TERM_GAP``
  such grants can be missed in a watch's delay), nor the term of another replica's grant after
  an earlier loss of the same run. Losses it may have missed while it saw nothing count too:
  one per lease of silence before the loss it sees, and one for a loss still shown after a
  request failed (the store may have come back from a second loss this replica could not
  see: that restarts the wait too).
"""

from __future__ import annotations

import dataclasses

from sidecar.backends.base import LeaseRecord, is_hold, room_for_marker

# How far a grant after a store loss jumps above every term seen, per loss in a row.
LOSS_TERM_GAP = 1000

ABSENT = "<absent>"  # the observation key of "the store holds no record at all"
RELEASED = "<released>"  # what was seen at the highest term: its release


@dataclasses.dataclass(frozen=True)
class Attempt:
    """When this replica may next try to acquire, and what it must name."""

    at: float
    """Monotonic time from which the attempt may be made."""

    expected: str | None
    """The version the store must still hold for the grant (None: no record at all)."""

    min_term: int
    """The floor for the new term: the grant gets ``max(stored term, min_term) + 1``."""

    why: str
    """new | released | handed | own | expired | lost — for logs and tests."""


class LeaseView:
    """One replica's observations of one lease. Pure bookkeeping: no I/O, no clock of its
    own — every observation carries the monotonic time at which its answer *arrived* (never
    the time the request was sent: the record may have been written after that)."""

    def __init__(self, identity: str, lease_duration: float, stand_back: float = 0.0) -> None:
        self.identity = identity
        self.lease_duration = lease_duration
        self.stand_back = stand_back  # how long to leave a released lease to its successor
        self.record: LeaseRecord | None = None
        self.seen_anything = False
        self.high_water = 0  # the highest term ever seen (rule 5)
        self.floor = 0  # the highest term seen before the record held now was first seen
        # What was seen at the highest term: its holder, RELEASED, or None (nothing known:
        # only a loss marker, or nothing yet).
        self._at_high_water: str | None = None
        self._key: str | None = None  # version (or ABSENT) of the record being timed
        self._since = 0.0  # when that version was first seen
        self._longest = lease_duration  # the longest lease any record declared
        self.loss_since: float | None = None  # start of the current loss's wait (rule 8)
        self.losses_in_a_row = 0  # losses counted since the store last showed a current term
        self._last_seen_at: float | None = None  # the previous observation's time
        # A request failed since the last observation: the store may have lost state while
        # this replica could not see it (a grant made and forgotten meanwhile). The next
        # observation that still shows a loss counts as a new loss and restarts the wait.
        self.blind = False
        # The last two grants the store showed, (holder, term), us included, newest last: the
        # grant a new one of ours replaces (the one before, when we saw ours already: handed).
        self._holders_seen: list[tuple[str, int]] = []

    # -- observing ---------------------------------------------------------------------

    def observe(self, record: LeaseRecord | None, at: float, *, from_watch: bool = False) -> bool:
        """Take one observation. ``from_watch``: the store's watch delivered it, i.e. the store
        may have changed (a store that shows no record has no version to compare, so each such
        delivery counts as a change). Returns True when this observation began a new loss."""
        previous_at, self._last_seen_at = self._last_seen_at, at
        blind, self.blind = self.blind, False
        key = record.version if record is not None else ABSENT
        changed = key != self._key or (from_watch and record is None)
        unknown = record is not None and (record.forgotten or record.unreadable is not None)
        behind = unknown or (
            self.seen_anything
            and (
                (record is None and self.high_water > 0)
                or (record is not None and record.term < self.high_water)
                or self._regranted(record, self.high_water if changed else self.floor)
            )
        )
        self.seen_anything = True
        self.record = record
        if record is not None and record.holder is not None:
            grant = (record.holder, record.term)
            if grant not in self._holders_seen:
                self._holders_seen = [*self._holders_seen[-1:], grant]
        if changed:
            self._key = key
            self._since = at
            self.floor = self.high_water
        if record is not None:
            self._note_at_high_water(record)
            self.high_water = max(self.high_water, record.term)
            if not is_hold(record.holder):
                # (A hold leads nothing: its length bounds no holder's belief that it leads.)
                self._longest = max(self._longest, record.duration)
        if not behind:
            self.loss_since = None
            if record is not None and (record.holder is not None or record.released):
                self.losses_in_a_row = 0  # the store shows a grant or release as new as any
            return False
        if self.loss_since is None or changed or blind:
            self.loss_since = at
            self.losses_in_a_row += 1 + self._losses_unseen(previous_at, at)
            return True
        return False

    def _regranted(self, record: LeaseRecord | None, seen_before: int) -> bool:
        """A grant of a term already used: the store forgot a grant (or its release) and
        granted its term again — say the leader, which never saw the forgotten grant, handed
        its lease over with the next term. Shown by the highest term seen granted to another
        holder than the one seen at it, or after its release (a grant after a release always
        has a higher term); or by a hand-over's grant not above every term seen before it
        (``seen_before``: a hand-over writes above the leader's own term, and a holder puts
        back only its own grants, never one handed to it)."""
        if record is None or record.holder is None:
            return False
        if record.handed is not None and record.term <= seen_before:
            return True
        return record.term == self.high_water and self._at_high_water not in (None, record.holder)

    def _note_at_high_water(self, record: LeaseRecord) -> None:
        """Remember what was seen at the highest term (for `_regranted`). A regrant's holder
        is remembered too, so its renewals are not each a new loss."""
        if record.term > self.high_water:
            self._at_high_water = None
        if record.term < self.high_water:
            return
        if record.released:
            self._at_high_water = RELEASED
        elif record.holder is not None:
            self._at_high_water = record.holder

    def lost_sight(self) -> None:
        """A request to the store failed: see `blind`."""
        self.blind = True

    def _losses_unseen(self, previous_at: float | None, at: float) -> int:
        """Losses this replica may have missed while it saw nothing (its watch was down): a
        grant after a loss waits a lease, so a silence of S seconds hides at most S / lease
        loss-and-grant cycles. Counting them keeps this grant's term above theirs."""
        if previous_at is None:
            return 0
        return int((at - previous_at) // self._longest)

    # -- deciding ----------------------------------------------------------------------

    def next_attempt(self, now: float) -> Attempt:
        """When (and naming what) this replica may next try to acquire, if it is not leading."""
        record = self.record
        if self.loss_since is not None:
            return Attempt(
                at=self.loss_since + self._longest,
                expected=record.version if record is not None else None,
                min_term=self.high_water + LOSS_TERM_GAP * max(1, self.losses_in_a_row),
                why="lost",
            )
        if record is None:
            # Nothing was ever shown to us (or nothing at all is stored and we never saw a
            # term): a new lease. A store that lost everything before we saw it looks the same;
            # that case is in the README's limits.
            return Attempt(now, None, self.high_water, "new")
        if record.holder == self.identity:
            return Attempt(now, record.version, self.high_water, "own")
        if record.free:
            if record.successor == self.identity:
                return Attempt(now, record.version, self.high_water, "handed")
            if record.successor is not None:
                at = self._since + self.stand_back
                return Attempt(max(now, at), record.version, self.high_water, "released")
            return Attempt(now, record.version, self.high_water, "released")
        # Someone else's (a record whose holder the store lost is a loss, above).
        return Attempt(self._since + record.duration, record.version, self.high_water, "expired")

    def replaced_holder(self, term: int, own_term: int) -> str | None:
        """Who held the grant our new one (``term``) replaced: the newest grant seen below it
        — ours only if we led with it (``own_term``; not a hand-over's grant we took again by
        a write)."""
        earlier = [
            holder
            for holder, seen in self._holders_seen
            if seen < term and (holder != self.identity or seen == own_term)
        ]
        return earlier[-1] if earlier else None

    def loss_to_write_down(self) -> int | None:
        """The term a follower writes down in a loss marker, if any (rule 5): in a loss, and
        the store shows nothing — or a marker, a release or a grant below the highest term we
        saw (`room_for_marker`). Without it, a replica that starts during the wait would see no
        term at all and grant term 1 again (and its successors 2, 3, ... again): the README's
        limit, shrunk to the moments between the loss and this write. Over a lower release or
        grant: the count that started again (a replica that started before anyone wrote the
        loss down) would otherwise climb from it, under our eyes, to the term we saw."""
        seen = self.high_water
        if seen == 0 or self.loss_since is None or self.blind:
            return None  # (blind: a request just failed; look again before writing)
        return seen if room_for_marker(self.record, seen) else None

    def hold_shown(self, now: float) -> tuple[float, float] | None:
        """For a lease on an operator's hold: (seconds since this replica first saw it, the
        hold's length); None otherwise."""
        record = self.record
        since = self.unchanged_since
        if record is None or since is None or not is_hold(record.holder):
            return None
        return max(0.0, now - since), record.duration

    @property
    def unchanged_since(self) -> float | None:
        """When this replica first saw the record it holds now (its version, or no record);
        None before its first observation."""
        return self._since if self.seen_anything else None

    def expires_in(self, now: float) -> float:
        """Seconds until the record being watched counts as expired here (0: may be taken)."""
        return max(0.0, self.next_attempt(now).at - now)
