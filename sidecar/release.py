"""Stepping down (rule 7): a leader demotes locally first — ``/leader`` answers 503 and the
demotion actions start — then releases the lease at the store, conditional on holder and term,
so a follower can take over within one round trip. Naming a successor makes the others stand
back briefly so that one takes it; with the version of the successor's candidate record it was
chosen by, the release grants it the lease in the same write where the store can (a hand-over,
`LeaseStore.hand_over`). Shutting down, a replica also gives back a grant handed to it that it
never took.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from sidecar.backends.base import LeaseRecord, NotOwned, StoreError
from sidecar.lease_handle import LeaseHandle
from sidecar.logs import log
from sidecar.status import Role

logger = logging.getLogger("sidecar.elector")  # the elector's lines: operators filter on it


class Releasable(LeaseHandle, Protocol):
    """What a release needs of its lease (`sidecar.elector.Elector`)."""

    @property
    def lock(self) -> asyncio.Lock: ...

    @property
    def role(self) -> Role: ...

    @property
    def stopping(self) -> bool: ...

    def demote(self, reason: str, *, settled: asyncio.Event | None = None) -> None: ...

    def stand_back(self) -> None:
        """After a voluntary release: give the others the lease for one lease."""
        ...


async def step_down(
    lease: Releasable,
    reason: str,
    timeout: float | None,
    successor: str | None,
    handed: str | None,
) -> bool:
    """Step down (see the module's docstring). False if not leading."""
    budget = lease.timing.request_timeout if timeout is None else timeout
    try:
        # A step in flight holds the lock for at most one request: never wait longer.
        # (`asyncio.timeout`, not `wait_for`: a free lock is then taken at once, where
        # `wait_for`'s task let every ready task run first — about 0.4 ms of a hand-off.)
        async with asyncio.timeout(budget + lease.timing.request_timeout):
            await lease.lock.acquire()
    except TimeoutError:
        # Demote all the same (/leader says 503 first); the lease then expires.
        leading = lease.role is Role.LEADER
        lease.demote(reason)
        return leading
    try:
        return await _release_locked(lease, reason, budget, successor, handed)
    finally:
        lease.lock.release()


async def _release_locked(
    lease: Releasable, reason: str, budget: float, successor: str | None, handed: str | None
) -> bool:
    if lease.role is not Role.LEADER:
        if lease.stopping:
            await _give_back_handed(lease, budget, look=False)
        return False
    term = lease.term
    settled = asyncio.Event()
    lease.demote(reason, settled=settled)
    try:
        return await _release_as(lease, reason, budget, term, successor, handed)
    finally:
        settled.set()


async def _release_as(
    lease: Releasable,
    reason: str,
    budget: float,
    term: int,
    successor: str | None,
    handed: str | None,
) -> bool:
    if reason == "released":
        lease.stand_back()  # give the others the lease instead of taking it straight back
    store = lease.store
    record: LeaseRecord | None
    try:
        if successor is not None and handed is not None and store.hands_over:
            to, by = successor, handed
            record = await lease.request(
                "hand_over",
                lambda: store.hand_over(
                    lease.identity,
                    term,
                    successor=to,
                    handed=by,
                    duration=lease.timing.lease_duration,
                    min_term=lease.view.high_water,
                ),
                budget,
            )
        else:
            record = await lease.request(
                "release",
                lambda: (
                    store.release(lease.identity, term, successor=successor)
                    if successor is not None
                    else store.release(lease.identity, term)
                ),
                budget,
            )
        lease.observe(record)
    except NotOwned as gone:
        lease.observe(gone.record)
    except StoreError as exc:
        # It may have landed, or still land: look before taking anything (the view still
        # shows the grant in our name).
        lease.view.lost_sight()
        log(
            logger,
            "warning",
            "could not release the lease; it will expire on its own",
            lease=lease.lease,
            error=str(exc),
            expires_within_seconds=lease.timing.lease_duration,
        )
    return True


async def give_back(lease: Releasable, budget: float) -> None:
    """Shutting down, holding nothing: read the lease, and release a grant handed to us
    since (see `_give_back_handed`)."""
    try:
        await asyncio.wait_for(lease.lock.acquire(), budget)
    except TimeoutError:
        return
    try:
        await _give_back_handed(lease, budget, look=True)
    finally:
        lease.lock.release()


async def _give_back_handed(lease: Releasable, budget: float, *, look: bool) -> None:
    """Shutting down, with a grant handed to us that we never took (the leader chose us
    a moment before it could know we were leaving): release it, so that the others may
    take it at once rather than wait it out. ``look``: read the store first."""
    if lease.role is Role.LEADER:
        return
    store = lease.store
    if look:
        try:
            lease.observe(await lease.request("read", store.read, budget))
        except StoreError:
            return
    record = lease.view.record
    if record is None or record.holder != lease.identity or record.handed is None:
        return
    try:
        lease.observe(
            await lease.request(
                "release",
                lambda: store.release(lease.identity, record.term),
                budget,
            )
        )
    except NotOwned as gone:
        lease.observe(gone.record)
    except StoreError:
        return
    log(logger, "info", "released a grant handed over while shutting down", lease=lease.lease)
