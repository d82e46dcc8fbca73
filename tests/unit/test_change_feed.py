"""`ChangeFeed` (issue 24): a change looks at the lease that changed, not at every lease, and a
leader's deadline passing without any election activity still wakes the waiters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from sidecar.changes import ChangeFeed
from sidecar.lease_set import LeaseSet


class Shown:
    """An elector as the feed sees it: what its ETag is made of, and `on_change`."""

    looked = 0  # `shown()` calls, every elector's

    def __init__(self, name: str) -> None:
        self.name = name
        self.holder: str | None = None
        self.term = 0
        self.leading_until = 0.0  # time.monotonic()
        self._listeners: list[Callable[[Any], None]] = []

    def on_change(self, listener: Callable[[Any], None]) -> None:
        self._listeners.append(listener)

    def shown(self) -> tuple[tuple[bool, str | None, int], float]:
        Shown.looked += 1
        valid_for = self.leading_until - time.monotonic()
        return (valid_for > 0, self.holder, self.term), max(0.0, valid_for)

    def change(self, holder: str, term: int, leads_for: float = 0.0) -> None:
        self.holder, self.term = holder, term
        self.leading_until = time.monotonic() + leads_for
        for listener in self._listeners:
            listener(self)


class Leases:
    def __init__(self, count: int) -> None:
        self.electors = {f"l{i}": Shown(f"l{i}") for i in range(count)}


async def changed_within(feed: ChangeFeed, seconds: float) -> bool:
    """Whether the feed's waiters are woken within ``seconds``."""
    event = feed._changed
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def test_a_change_looks_at_the_lease_that_changed_not_at_every_lease() -> None:
    leases = Leases(1000)
    feed = ChangeFeed(cast(LeaseSet, leases))
    follower = asyncio.create_task(feed.follow())
    try:
        await asyncio.sleep(0.01)  # the first look, at every lease
        one = leases.electors["l7"]
        Shown.looked = 0
        for term in range(1, 101):
            waking = asyncio.ensure_future(changed_within(feed, 2))
            await asyncio.sleep(0)
            one.change("b_1", term)
            assert await waking, "a change did not wake the waiters"
        # Looking at all 1,000 after each of the 100 changes was 100,000 looks.
        assert Shown.looked <= 200, Shown.looked
    finally:
        follower.cancel()


async def test_a_leader_whose_deadline_passes_wakes_the_waiters_without_any_change() -> None:
    leases = Leases(100)
    feed = ChangeFeed(cast(LeaseSet, leases))
    follower = asyncio.create_task(feed.follow())
    try:
        await asyncio.sleep(0.01)
        waking = asyncio.ensure_future(changed_within(feed, 2))
        await asyncio.sleep(0)
        leases.electors["l3"].change("me", 4, leads_for=0.2)  # now leads here
        assert await waking
        waking = asyncio.ensure_future(changed_within(feed, 2))
        began = time.monotonic()
        assert await waking, "the deadline passed and nobody was told"
        assert time.monotonic() - began >= 0.15  # at the deadline, not before
        # A renewal moves the deadline without a poke: reaching the old one only looks again.
        one = leases.electors["l5"]
        one.change("me", 9, leads_for=0.2)
        await asyncio.sleep(0.1)
        one.leading_until = time.monotonic() + 0.5  # renewed, silently
        assert not await changed_within(feed, 0.3)
        assert await changed_within(feed, 0.5)
    finally:
        follower.cancel()


async def test_a_deadline_that_comes_looks_at_that_leader_not_at_every_leader() -> None:
    """A replica may lead 1,000 leases: their deadlines come one after another, and a look
    at every leader each time was 1,000 looks per deadline."""
    leases = Leases(1000)
    for elector in leases.electors.values():
        elector.holder, elector.term = "me", 1
        elector.leading_until = time.monotonic() + 30.0
    feed = ChangeFeed(cast(LeaseSet, leases))
    follower = asyncio.create_task(feed.follow())
    try:
        await asyncio.sleep(0.01)
        short = leases.electors["l9"]
        short.change("me", 2, leads_for=0.1)
        await asyncio.sleep(0.01)
        Shown.looked = 0
        assert await changed_within(feed, 2), "the deadline passed and nobody was told"
        assert Shown.looked <= 3, Shown.looked
    finally:
        follower.cancel()
