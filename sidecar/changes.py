"""Long-poll and SSE waiters, woken only when an answer they hold changes.

One task per listener follows the leases; every waiter sleeps on one shared event that is set
only when some lease's ETag (leader flag, holder, term) changes. Before, each waiter on the
leader woke at every renewal (its deadline moved); thousands of idle long-polls then cost the
loop time the renewals need. The answer itself is still computed at the moment it is sent
(rule 4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from sidecar.lease_set import LeaseSet

FOLLOW_SECONDS = 60.0  # how long the follower task waits per call; any value works
T = TypeVar("T")


class ChangeFeed:
    def __init__(self, leases: LeaseSet) -> None:
        self._leases = leases
        self._shown = self._look()[0]
        self._changed = asyncio.Event()
        self._poked: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        # A wake-up is on its way to the feed's loop: further changes ride on it. A batch of
        # renewals or an acquire storm changes hundreds of leases at once, and each wake-up
        # across threads is a write to the loop's socket that hands the GIL over (issue 24:
        # thousands of them cost seconds of CPU at start-up).
        self._pending = False
        poke = self._poke  # one bound method for every elector, not one each
        for elector in leases.electors.values():
            elector.on_change(poke)

    def _poke(self) -> None:
        """An elector's state changed (called on the election's thread)."""
        poked = self._poked
        if poked is not None and not self._pending:
            self._pending = True
            poked[0].call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        """On the feed's loop: look at every lease again. Cleared before the look, so a change
        made after it wakes the feed once more."""
        self._pending = False
        if self._poked is not None:
            self._poked[1].set()

    async def follow(self) -> None:
        """Run until cancelled: the only task that wakes for the electors. It runs on the
        listener's loop, which need not be the election's (see `sidecar.api_thread`): each
        elector pokes it thread-safely on every change, and it times the leaders' deadlines
        itself, since a deadline passes without any election activity."""
        poked = asyncio.Event()
        self._poked = (asyncio.get_running_loop(), poked)
        while True:
            poked.clear()  # before reading: a change after this read pokes again
            shown, deadlines = self._look()
            if shown != self._shown:
                self._shown = shown
                self._changed.set()
                self._changed = asyncio.Event()
            timeout = min(deadlines, default=FOLLOW_SECONDS)
            try:
                async with asyncio.timeout(timeout):
                    await poked.wait()
            except TimeoutError:
                pass

    def _look(self) -> tuple[list[tuple[bool, str | None, int]], list[float]]:
        """Every lease's ETag as what it is made of (no hashing: 10,000 leases are looked at
        after every change), and when each lease led here stops being led."""
        shown: list[tuple[bool, str | None, int]] = []
        deadlines: list[float] = []
        for elector in self._leases.electors.values():
            state, valid_for = elector.shown()
            shown.append(state)
            if state[0]:
                deadlines.append(valid_for + 0.001)
        return shown, deadlines

    async def wait(
        self,
        current: Callable[[], T],
        etag_of: Callable[[T], str],
        etag: str,
        timeout: float,
        gone: asyncio.Event | None = None,
    ) -> T:
        """``current()`` once its ETag differs from ``etag``, or when ``timeout`` passes, or
        as soon as ``gone`` is set (the client went away: its slot is free at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            answer = current()
            remaining = deadline - loop.time()
            if etag_of(answer) != etag or remaining <= 0 or (gone is not None and gone.is_set()):
                return answer
            changed = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await (changed.wait() if gone is None else _either(changed, gone))
            except TimeoutError:
                pass


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Until one of the two is set."""
    waits = {asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
