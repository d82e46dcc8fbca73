"""The one list-then-watch loop (a reflector, as client-go's) behind every Kubernetes watch of
the sidecar: the one-Lease watch (`store`), the many-Lease namespace watch (`fanout`) and the
candidates (`candidates`). Three copies of this loop drifted into three behaviours;
one copy keeps them a good neighbour of an API server that is already failing.

The loop: list, then watch from the list's resourceVersion (``allowWatchBookmarks``: a
bookmark moves the resourceVersion on, so a resume after a quiet hour is not a 410); when the
server ends a watch cleanly (``timeoutSeconds``), watch again from the last resourceVersion.

How it waits, as client-go's reflector does (`Backoff`, `Pacing`):

* After every failure — the list or the watch refused or unreachable, the stream broken, a
  ``410 Gone`` — it waits before trying again: 0.8 s, doubling to 30 s, each wait jittered up
  to twice as long (30 to 60 s at the cap, reached after 50 to 100 s of failures). The back-off
  starts over only after 2 minutes without a failure: a list that succeeds between two refused
  watches does not reset it.
* A watch that the server ends within 1 s having delivered no event (not even a bookmark) is a
  failure too ("very short watch"): a proxy or load balancer that closes every long stream at
  once would otherwise be asked thousands of times a second. The loop then resumes from the
  same resourceVersion (the server answered, in order; nothing suggests its storage changed).
* Any other failure lists again rather than resuming: the API server may have restarted with
  its storage wiped or restored, and a resume from a resourceVersion it no longer knows can be
  silent. After a ``410`` it lists again too, after the same jittered wait.
* A ``429`` or ``5xx`` with ``Retry-After`` is never retried before it (at most
  `client.MAX_RETRY_AFTER`).

So once the back-off is at its cap a loop sends at most one request per 30 s to an API server
that keeps failing, and a healthy one tells a follower of a release in milliseconds: no wait
is ever added to a watch that is delivering events, and the leases' own requests (renewals,
acquisitions) never go through this loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from sidecar.backends.kit.backoff import Backoff
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.watch import Relist, Selection, list_leases, stream_leases
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log

logger = logging.getLogger("sidecar.kubernetes")


@dataclasses.dataclass(frozen=True)
class Pacing:
    """How a reflector waits: client-go's numbers, and the clock and sleep it measures and
    waits with (tests give it a fake clock and a sleep that moves it, and count the requests
    the loop sends against that clock)."""

    initial: float = 0.8  # seconds: the first wait after a failure
    cap: float = 30.0  # the longest wait before jitter
    factor: float = 2.0
    jitter: float = 1.0  # each wait is up to (1 + jitter) times its step
    reset_after: float = 120.0  # seconds without a failure before the back-off starts over
    short_watch: float = 1.0  # a watch ended sooner with no event is a failure
    clock: Clock = SYSTEM_CLOCK
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep


CLIENT_GO = Pacing()


def client_go_backoff(pacing: Pacing, rng: random.Random) -> Backoff:
    """client-go's back-off manager of the reflector (``NewExponentialBackoffManager(800ms,
    30s, 2min, 2.0, 1.0)``): each failure waits its step, jittered up to twice as long, and
    doubles the step up to the cap; the step goes back to the start only after
    ``reset_after`` seconds without a failure, counted from the end of the last wait."""
    return Backoff(
        pacing.initial,
        pacing.cap,
        factor=pacing.factor,
        jitter=(1.0, 1.0 + pacing.jitter),
        reset_after=pacing.reset_after,
        clock=pacing.clock,
        rng=rng,
    )


class ShortWatch(Exception):
    """The server ended a watch at once without an event: a failure, then resume."""


@dataclasses.dataclass(frozen=True)
class Listed:
    """What a (re)list found: every selected object, as the server holds them now."""

    items: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Changed:
    """One watch event: ``kind`` is ADDED, MODIFIED or DELETED."""

    kind: str
    obj: dict[str, Any]


class Reflector:
    """List and watch the Leases of ``selection``; see the module docstring. ``what`` names the
    loop in logs and requests ("lease", "leases <selector>", "candidates")."""

    def __init__(
        self,
        api: KubeApi,
        selection: Selection,
        what: str,
        *,
        watch_timeout: float = 60.0,
        pacing: Pacing = CLIENT_GO,
        rng: random.Random | None = None,
    ) -> None:
        self.api = api
        self.selection = selection
        self.what = what
        self.watch_timeout = watch_timeout
        self.pacing = pacing
        self._rng = rng or random.Random()
        # True from a list, or the start of a watch resuming from a known resourceVersion,
        # until the next failure: no change goes unseen meanwhile.
        self.synced = False
        self.failures = 0  # in a row, for the logs

    async def events(self) -> AsyncGenerator[Listed | Changed, None]:
        """`Listed` after every (re)list, then a `Changed` per event. Never raises but
        CancelledError; runs until the caller stops iterating."""
        backoff = client_go_backoff(self.pacing, self._rng)
        version: str | None = None
        try:
            while True:
                try:
                    if version is None:
                        items, version = await list_leases(
                            self.api, self.selection, f"list {self.what}"
                        )
                        self.synced = True
                        yield Listed(items)
                    self.synced = True
                    started = self.pacing.clock.now()
                    delivered = 0
                    async for kind, obj, resume_at in stream_leases(
                        self.api, self.selection, version, self.watch_timeout, f"watch {self.what}"
                    ):
                        delivered += 1  # a bookmark too: the stream works
                        version = resume_at
                        self.failures = 0
                        if obj is not None and kind in ("ADDED", "MODIFIED", "DELETED"):
                            yield Changed(kind, obj)
                    if (
                        not delivered
                        and self.pacing.clock.now() - started < self.pacing.short_watch
                    ):
                        raise ShortWatch("the server ended the watch at once, with no event")
                    self.failures = 0
                    continue  # a clean end (timeoutSeconds): resume from version
                except ShortWatch as short:
                    delay = self._failed(backoff, short, relist=False)
                except Relist as relist:
                    version = None
                    delay = self._failed(backoff, relist, relist=True)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # CallError, StoreUnavailable, WatchBroken, bad JSON
                    version = None  # list again rather than resume (see the module docstring)
                    retry_after = getattr(exc, "retry_after", None)
                    delay = self._failed(backoff, exc, relist=True, retry_after=retry_after)
                await self.pacing.sleep(delay)
        finally:
            self.synced = False

    def _failed(
        self,
        backoff: Backoff,
        error: Exception,
        *,
        relist: bool,
        retry_after: float | None = None,
    ) -> float:
        """Count a failure, log it, and return the seconds to wait."""
        self.synced = False
        self.failures += 1
        delay = backoff.failed()
        if retry_after is not None:
            delay = max(delay, retry_after)  # never before the server's Retry-After
        expired = isinstance(error, Relist)
        loud = not expired and (self.failures in (3, 10) or self.failures % 50 == 0)
        log(
            logger,
            "warning" if loud else ("info" if expired else "debug"),
            f"{self.what} watch interrupted; {'listing again' if relist else 'resuming'}",
            selector=self.selection.label_selector or self.selection.field_selector,
            error=str(error),
            failures=self.failures,
            retry_in_seconds=round(delay, 3),
        )
        return delay
