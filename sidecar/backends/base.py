"""The contract every lease store implements.

The elector imports this module and nothing else from `sidecar.backends`. A store keeps one
lease record and guarantees, *at the store*, atomically:

* ``try_acquire`` grants the lease only if it is free, expired, or already held by the caller,
  and sets ``term = max(stored term, min_term) + 1`` in the same write (safety rules 1 and 5).
* ``try_acquire`` refuses, writing nothing, when the store's term is below ``min_term`` (or it
  has no record although ``min_term > 0``): the store has lost state — restarted without
  persistence, failed over to a replica that missed writes, or its record was deleted — so it
  can no longer show a holder that may still believe it leads. It raises `StoreBehind`; the
  elector waits one full lease, then asks again with ``after_reset=True``, which grants (if the
  lease is free) with ``min_term + 1``.
* ``renew`` and ``release`` change the record only while ``holder`` and ``term`` are still the
  caller's; otherwise they change nothing and raise `NotOwned` (rule 1).
* Expiry is judged by the store's own rule, never by comparing the clocks of two hosts
  (rule 2): Redis uses the server's TTL, Kubernetes the time *this process* has watched an
  unchanged resourceVersion, SQLite one host's ``CLOCK_BOOTTIME``.

Every call either returns a `LeaseRecord` or raises one of the exceptions below; no call answers
a bare ``False`` that throws the reason away. Calls may block for at most the store's request
timeout; the elector wraps each call in its own deadline as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One observation of the lease: the only type that crosses the backend boundary."""

    holder: str | None
    """Identity holding the lease, or None when it was released (or never taken)."""

    term: int
    """Fencing token of the latest grant. Kept when the lease is released."""

    duration: float
    """Lease duration in seconds, as written by the holder."""

    expires_in: float
    """Seconds from the moment of this observation until the store would let another
    candidate take the lease, judged by the store's own expiry rule; 0 when free or expired."""

    version: str
    """Opaque; changes on every write (Kubernetes resourceVersion, a row version, …)."""

    acquired_at: datetime | None = None
    """Wall-clock time of the grant, for humans only."""

    renewed_at: datetime | None = None
    """Wall-clock time of the last renewal, for humans only."""

    @property
    def free(self) -> bool:
        """True when another candidate may take the lease now."""
        return self.holder is None or self.expires_in <= 0


class StoreError(Exception):
    """Base of every error a store raises."""


class StoreUnavailable(StoreError):
    """The store could not be reached or did not answer in time; nothing is known."""


class _WithRecord(StoreError):
    def __init__(self, message: str, record: LeaseRecord | None) -> None:
        super().__init__(message)
        self.record = record


class LeaseHeld(_WithRecord):
    """``try_acquire`` found another holder's unexpired lease; ``record`` is what it found."""


class NotOwned(_WithRecord):
    """``renew``/``release`` found a record that is not the caller's (other holder, other term,
    or no record); nothing was changed. ``record`` is what was found, if known."""


class StoreBehind(_WithRecord):
    """``try_acquire`` found the store's term below ``min_term``: it lost state, and a holder
    it no longer shows may still be leading. Nothing was written; ``record`` is what it holds
    (None: nothing)."""


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
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        """Grant the lease to ``identity`` if it is free, expired, or already ``identity``'s,
        with ``term = max(stored term, min_term) + 1``. If the stored term is below
        ``min_term`` and not ``after_reset``, raise `StoreBehind` without writing. Raises
        `LeaseHeld`, `StoreBehind`, `Conflict` or `StoreUnavailable`."""
        ...

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        """Extend the lease by ``duration`` if ``identity`` still holds it with ``term``.
        Raises `NotOwned`, `Conflict` or `StoreUnavailable`."""
        ...

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        """Free the lease (keeping its term) if ``identity`` still holds it with ``term``.
        Raises `NotOwned`, `Conflict` or `StoreUnavailable`."""
        ...

    def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield the record soon after it changes (at least on every release and every new
        holder; duplicates and coalescing allowed). Runs until cancelled and reconnects on
        its own; it never raises `StoreError`."""
        ...

    async def close(self) -> None:
        """Release connections and threads. The lease itself is left as it is."""
        ...
