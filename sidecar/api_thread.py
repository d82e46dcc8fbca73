"""The listeners' own thread and event loop, so HTTP load cannot delay a renewal.

The election (elector, store, demotion actions) keeps the main thread's loop to itself. Both
listeners run here: a flood of requests, thousands of long-polls or a slow `/metrics` scrape
cost this loop's time, not the election's. They share only what is safe across threads:
`Elector.status()` is computed from plain attributes (rule 4: the leader flag is guarded by
`valid_until`, set last on a grant and cleared first on a demotion), the elector pokes the
listeners' change feeds with ``call_soon_threadsafe``, a release is handed to the election's
loop, and prometheus-client's registry is thread-safe. CPython's GIL is handed over at least
every 5 ms, so a busy listener thread delays the election by milliseconds, not by the time
its requests take.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ApiThread:
    def __init__(self, name: str = "api") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the listeners' loop and wait for it from the caller's loop."""
        return await asyncio.wrap_future(self.submit(work))

    def close(self, timeout: float = 1.0) -> None:
        """Stop the loop once whatever runs on it is done; the thread is a daemon, so a stuck
        handler cannot keep the process alive."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def on_loop(loop: asyncio.AbstractEventLoop | None, work: Awaitable[T]) -> T:
    """Await ``work`` on ``loop`` (the election's), from whichever loop is running."""
    if loop is None or loop is asyncio.get_running_loop():
        return await work
    # run_coroutine_threadsafe wants a coroutine; every caller passes one.
    future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
        work,  # type: ignore[arg-type]
        loop,
    )
    return await asyncio.wrap_future(future)
