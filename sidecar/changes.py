"""Long-poll and SSE waiters, woken only when the answer they hold changes.

One task per listener follows the elector; every waiter sleeps on one shared event that is set
only when the ETag (leader flag, holder, term) changes. Before, each waiter on the leader woke
at every renewal (its deadline moved); thousands of idle long-polls then cost the loop time the
renewals need. The answer itself is still computed at the moment it is sent (rule 4).
"""

from __future__ import annotations

import asyncio

from sidecar.elector import Elector, LeaderStatus

FOLLOW_SECONDS = 60.0  # how long the follower task waits per call; any value works


class ChangeFeed:
    def __init__(self, elector: Elector) -> None:
        self._elector = elector
        self._etag = elector.status().etag
        self._changed = asyncio.Event()

    async def follow(self) -> None:
        """Run until cancelled: the only task that wakes for the elector. It runs on the
        listener's loop, which need not be the election's (see `sidecar.api_thread`): the
        elector pokes it thread-safely on every change, and it times the leader's deadline
        itself, since a deadline passes without any election activity."""
        loop = asyncio.get_running_loop()
        poked = asyncio.Event()
        self._elector.on_change(lambda: loop.call_soon_threadsafe(poked.set))
        while True:
            poked.clear()  # before reading: a change after this read pokes again
            status = self._elector.status()
            if status.etag != self._etag:
                self._etag = status.etag
                self._changed.set()
                self._changed = asyncio.Event()
            timeout = status.valid_for + 0.001 if status.leader else FOLLOW_SECONDS
            try:
                async with asyncio.timeout(timeout):
                    await poked.wait()
            except TimeoutError:
                pass

    async def wait(self, etag: str, timeout: float) -> LeaderStatus:
        """The state once its ETag differs from ``etag``, or when ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            status = self._elector.status()
            remaining = deadline - loop.time()
            if status.etag != etag or remaining <= 0:
                return status
            changed = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                pass
