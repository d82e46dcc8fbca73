"""Long-poll and SSE waiters, woken only when an answer they hold changes.

One task per listener follows the leases; every waiter sleeps on one shared event that is set
only when some lease's ETag (leader flag, holder, term) changes. Before, each waiter on the
leader woke at every renewal (its deadline moved); thousands of idle long-polls then cost the
loop time the renewals need. The answer itself is still computed at the moment it is sent
(rule 4).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

from sidecar.elector import Elector
from sidecar.lease_set import LeaseSet

FOLLOW_SECONDS = 60.0  # how long the follower task waits per call; any value works
T = TypeVar("T")
Shown = tuple[bool, str | None, int]  # what a lease's ETag is made of (`Elector.shown`)


class ChangeFeed:
    def __init__(self, leases: LeaseSet) -> None:
        self._leases = leases
        # What each lease showed at the last look, and when each lease led here stops being
        # led (by `time.monotonic`, the loop's clock; renewals move it without a poke, so a
        # deadline reached is only the time to look again), also in a heap: a wake-up takes
        # the leaders whose deadline came, not every leader (an entry whose lease was looked
        # at again since is stale: skipped).
        self._shown: dict[Elector, Shown] = {}
        self._leading: dict[Elector, float] = {}
        self._deadlines: list[tuple[float, int, Elector]] = []
        self._entries = itertools.count()  # (ties in the heap: never compare electors)
        self._look(leases.electors.values())
        self._changed = asyncio.Event()
        # The electors that changed since the last look (appended on the election's thread;
        # a deque's append and popleft are atomic). A look is at them alone: at 10,000 leases
        # looking at every lease after every change took a third of the CPU of a replica
        # starting up.
        self._poked_by: deque[Elector] = deque()
        self._poked: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        # A wake-up is on its way to the feed's loop: further changes ride on it. A batch of
        # renewals or an acquire storm changes hundreds of leases at once, and each wake-up
        # across threads is a write to the loop's socket that hands the GIL over:
        # thousands of them cost seconds of CPU at start-up.
        self._pending = False
        poke = self._poke  # one bound method for every elector, not one each
        for elector in leases.electors.values():
            elector.on_change(poke)

    def _poke(self, elector: Elector) -> None:
        """``elector``'s ETag changed (called on the election's thread)."""
        self._poked_by.append(elector)
        poked = self._poked
        if poked is not None and not self._pending:
            self._pending = True
            poked[0].call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        """On the feed's loop: look again. Cleared before the look, so a change made after it
        wakes the feed once more."""
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
        # Changes before this task ran poked nobody: look at every lease once.
        looking: list[Elector] = list(self._leases.electors.values())
        while True:
            poked.clear()  # before reading: a change after this read pokes again
            while self._poked_by:
                looking.append(self._poked_by.popleft())
            now = time.monotonic()
            deadlines = self._deadlines
            while deadlines and deadlines[0][0] <= now:
                until, _, elector = heapq.heappop(deadlines)
                if self._leading.get(elector) == until:
                    looking.append(elector)
            if self._look(looking):
                self._changed.set()
                self._changed = asyncio.Event()
            looking = []
            timeout = (deadlines[0][0] if deadlines else now + FOLLOW_SECONDS) - now
            try:
                async with asyncio.timeout(max(0.0, timeout)):
                    await poked.wait()
            except TimeoutError:
                pass

    def _look(self, electors: Iterable[Elector]) -> bool:
        """Look at these leases again: whether any ETag changed, compared by what it is made
        of (no hashing), and when each one led here stops being led."""
        changed = False
        now = time.monotonic()
        for elector in electors:
            state, valid_for = elector.shown()
            if self._shown.get(elector) != state:
                self._shown[elector] = state
                changed = True
            if state[0]:
                until = now + valid_for + 0.001
                self._leading[elector] = until
                heapq.heappush(self._deadlines, (until, next(self._entries), elector))
            else:
                self._leading.pop(elector, None)
        return changed

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
