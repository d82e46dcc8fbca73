"""An operator's hold (``leader-sidecar hold`` / ``resume``): stop a job fleet-wide without
scaling the app to zero.

A hold is a grant like any other (rule 1: one conditional write over the exact version read;
rule 5: a term above the stored one) to a holder no sidecar is, ``leader-sidecar.io/hold by
WHO: REASON``, for the hold's duration. So nothing new is trusted:

* the leader it stopped sees a grant to another at a higher term and stops at once (rule 5);
  a write it still makes carries the older term and is fenced like any stale leader's;
* the others see a held lease and wait it out like any other (rule 2): nobody leads until
  ``resume`` releases it (free at once) or each replica has seen it unchanged for its
  duration — a forgotten hold ends by itself (a replica that starts during the hold waits
  the whole duration from when it first sees it: expiry is never read from a clock).
"""

from __future__ import annotations

import asyncio
import getpass
import random
import socket

from sidecar.backends.base import (
    HOLD_HOLDER,
    Conflict,
    LeaseHeld,
    LeaseRecord,
    LeaseStore,
    NotOwned,
    is_hold,
)
from sidecar.backends.records import MAX_TEXT

DEFAULT_HOLD = 3600.0  # a forgotten hold ends by itself within the hour
TRIES = 5  # a write that raced a renewal reads again; bounded, jittered


class HoldRefused(Exception):
    """The hold cannot be written; ``str()`` says why and what to do."""


def default_who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _clean(text: str) -> str:
    """One line of printable text: the holder is shown in logs, Events and terminals."""
    return "".join(c if c.isprintable() else " " for c in text).strip()


def hold_holder(who: str, reason: str) -> str:
    """The holder name of a hold, at most the store's text limit."""
    who = _clean(who).replace(": ", " ") or "unknown"
    holder = f"{HOLD_HOLDER} by {who}"
    reason = _clean(reason)
    if reason:
        holder += f": {reason}"
    return holder[:MAX_TEXT]


def parse_hold(holder: str) -> tuple[str | None, str | None]:
    """(who, reason) of a hold's holder name."""
    rest = holder.removeprefix(HOLD_HOLDER).strip()
    rest = rest.removeprefix("by ")
    who, _, reason = rest.partition(": ")
    return (who or None), (reason or None)


async def hold(
    store: LeaseStore, who: str, reason: str, duration: float, timeout: float
) -> LeaseRecord:
    """Grant the lease to a hold over whatever the store holds now. Raises `HoldRefused`."""
    holder = hold_holder(who, reason)
    for attempt in range(TRIES):
        async with asyncio.timeout(timeout):
            record = await store.read()
        if record is not None and record.unreadable is not None:
            raise HoldRefused(
                f"the lease record cannot be read ({record.unreadable}); the sidecars wait it "
                "out and take it over with a safe term: hold it once they have"
            )
        expected = record.version if record is not None else None
        floor = record.term if record is not None else 0
        try:
            async with asyncio.timeout(timeout):
                return await store.try_acquire(holder, duration, floor, expected=expected)
        except (LeaseHeld, Conflict):
            # A renewal landed between the read and the write: read again.
            await asyncio.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise HoldRefused(f"the lease changed under every one of {TRIES} tries; try again")


async def resume(store: LeaseStore, timeout: float) -> LeaseRecord | None:
    """Release the hold (free at once: the first replica whose app is up takes it). None when
    the lease is not on hold. Raises `HoldRefused` when it changed meanwhile."""
    async with asyncio.timeout(timeout):
        record = await store.read()
    if record is None or not is_hold(record.holder):
        return None
    assert record.holder is not None
    try:
        async with asyncio.timeout(timeout):
            released = await store.release(record.holder, record.term)
    except (NotOwned, Conflict) as exc:
        raise HoldRefused(f"the hold changed meanwhile ({exc}); run status and try again") from None
    return released if released is not None else record
