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
        """Run until cancelled: the only task that wakes at the elector's deadline ticks."""
        while True:
            status = await self._elector.wait_for_change(self._etag, FOLLOW_SECONDS)
            if status.etag != self._etag:
                self._etag = status.etag
                self._changed.set()
                self._changed = asyncio.Event()

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
