"""The one renewal path. A lease renewing on its own (`Elector.step`) is a batch of one; the
leases the scheduler renews together (`sidecar.schedule`) are a batch of many. Either way, with
each lease's lock held from before the send until its outcome is applied:

1. `begin_renewal`: a leader past its deadline demotes and stays out (rule 3); the others name
   the term they renew under.
2. One `RenewsMany.renew_many` request, guarded like every store call (`sidecar.store_call`)
   and counted once. Every deadline counts from the moment it is *sent* (rule 3). It waits at
   most a request timeout; a lease renewing on its own cuts it at its deadline too, while a
   batch's leases demote on their own timers (`sidecar.schedule`).
3. The sidecar's store probe hears once whether the store answered: an entry's own error (a
   value the store cannot decode) says nothing of the others; a request of which nothing is
   known fails every lease alike.
4. `finish_renewal`: each lease's outcome applied to that lease alone — rule 1 per lease (the
   store checked holder and term per lease), rule 3 per lease (an answer that arrives after
   its deadline extends nothing).

A store that cannot renew many leases in one request, and a lease renewing on its own, go
through `RenewsEach`: one ``renew`` each, so a batch of one sends exactly that ``renew``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from sidecar.backends.base import (
    LeaseRecord,
    Renewal,
    RenewalOutcome,
    RenewsMany,
    StoreError,
    StoreUnavailable,
)
from sidecar.clock import Clock
from sidecar.probe import StoreProbe
from sidecar.store_call import ANSWERS, Count, outcome_of, store_call
from sidecar.timing import Timing


class Renewing(Protocol):
    """What the renewal path needs of a lease (`sidecar.elector.Elector`)."""

    @property
    def identity(self) -> str: ...

    @property
    def timing(self) -> Timing: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def lock(self) -> asyncio.Lock:
        """Held by whatever mutates the lease at the store: a step, a batch, a release."""
        ...

    @property
    def probe(self) -> StoreProbe | None: ...

    def begin_renewal(self, now: float) -> int | None:
        """Step 1: the term to renew under, or None when not leading (demoted, maybe now)."""
        ...

    def finish_renewal(
        self, sent: float, term: int, outcome: RenewalOutcome, *, answered: bool
    ) -> float:
        """Step 4: apply this lease's outcome; the delay until its next step."""
        ...


R = TypeVar("R", bound=Renewing)


async def renew_held(
    leases: Sequence[R],
    client: RenewsMany,
    name_of: Callable[[R], str],
    count: Count,
    *,
    until: float = float("inf"),
) -> list[tuple[R, float]]:
    """Steps 1 to 4 for ``leases``, whose locks the caller holds, in one request to ``client``
    (``name_of``: each lease's name at the store), cut at the monotonic moment ``until`` if it
    comes before a request timeout. Returns each lease that was renewed or tried, with the
    delay until its next step; one that demoted at step 1 is not among them."""
    if not leases:
        return []
    clock = leases[0].clock
    now = clock.now()
    members = [(lease, term) for lease in leases if (term := lease.begin_renewal(now)) is not None]
    if not members:
        return []
    renewals = [
        Renewal(name_of(lease), lease.identity, term, lease.timing.lease_duration)
        for lease, term in members
    ]
    sent = clock.now()  # rule 3: every deadline counts from here
    budget = min(members[0][0].timing.request_timeout, until - sent)
    outcomes: Sequence[RenewalOutcome]
    failure: StoreError | None = None
    try:
        outcomes = await store_call(
            "renew",
            lambda: _renew_many(client, renewals),
            budget,
            clock=clock,
            count=count,
            answered_as=_answered_as,
        )
    except StoreError as failed:
        failure = failed
        outcomes = [failed] * len(members)
    probe = members[0][0].probe
    if probe is not None:
        if failure is None:
            probe.answered()
        else:
            probe.refused(failure)
    delays: list[tuple[R, float]] = []
    for (lease, term), outcome in zip(members, outcomes, strict=True):
        delays.append((lease, lease.finish_renewal(sent, term, outcome, answered=failure is None)))
    return delays


async def _renew_many(client: RenewsMany, renewals: list[Renewal]) -> list[RenewalOutcome]:
    """The store's answer, one outcome per renewal; `StoreUnavailable` for an answer that is
    not one (a store that broke the contract: nothing is known)."""
    answer = await client.renew_many(renewals)
    if len(answer) != len(renewals):
        raise StoreUnavailable(
            f"renew_many answered {len(answer)} outcomes for {len(renewals)} leases"
        )
    return [a if isinstance(a, (LeaseRecord, StoreError)) else _bad(a) for a in answer]


def _bad(answer: object) -> StoreError:
    return StoreUnavailable(f"renew_many answered {type(answer).__name__}, not an outcome")


def _answered_as(outcomes: Sequence[RenewalOutcome]) -> str:
    """How an answered request is counted: as the store's refusal when it refused every lease
    of it alike (a lease renewing alone that was taken over: ``not_owned``), else ``ok``."""
    refused = [outcome for outcome in outcomes if isinstance(outcome, ANSWERS)]
    kinds = {outcome_of(outcome) for outcome in refused}
    if refused and len(refused) == len(outcomes) and len(kinds) == 1:
        return kinds.pop()
    return "ok"


class Batching(Generic[R]):
    """How a set's renewals go in one request: the client that renews many, each lease's name
    at the store, and where the request is counted (once per batch)."""

    def __init__(self, client: RenewsMany, names: Mapping[R, str], count: Count) -> None:
        self.client = client
        self.names = dict(names)
        self.count = count

    async def renew(self, leases: Sequence[R]) -> None:
        """Renew ``leases`` in one request: each lease's lock is held from before the send
        until its outcome is applied, as for a renewal of its own."""
        held: list[R] = []
        try:
            for lease in leases:
                await lease.lock.acquire()  # free (the scheduler), unless a release came first
                held.append(lease)
            await renew_held(held, self.client, self.names.__getitem__, self.count)
        finally:
            for lease in held:
                lease.lock.release()
