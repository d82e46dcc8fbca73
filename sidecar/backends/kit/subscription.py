"""One running watch of one lease, as a store's hub hands records to it: either an async
iterator (`Subscription.records`, woken through an event) or a callback (`follow`, called on
the hub's task with each changed record: no task, event and generator per lease)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from sidecar.backends.base import LeaseRecord

# What a subscription has seen before its first yield: unlike any version, and unlike None
# (no record), so the first offer always yields.
_UNSEEN: Any = object()


class Subscription:
    """The latest record not yet yielded and a flag to wake the iterator, or the callback the
    records go to."""

    __slots__ = ("callback", "ended", "latest", "name", "ready", "seen")

    def __init__(
        self, name: str, callback: Callable[[LeaseRecord | None], None] | None = None
    ) -> None:
        self.name = name
        self.seen: LeaseRecord | None = _UNSEEN
        self.latest: LeaseRecord | None = None
        # (An event is ~0.7 KB: a callback needs none, and a sidecar may follow 10,000 leases.)
        self.ready = asyncio.Event() if callback is None else None
        self.ended = False
        self.callback = callback

    @property
    def fresh(self) -> bool:
        """Started (or restarted after a failure) and not yet told the current record."""
        return self.seen is _UNSEEN

    def offer(self, record: LeaseRecord | None, *, again: bool = False) -> None:
        """Yield ``record`` if it differs from the last one yielded: a new version, or the
        same version with other contents (a hand edit, which leaves the version as it was).
        ``again``: yield it even if unchanged (a reconnection: the contract's "once after every
        (re)connection")."""
        if self.ended or not (again or self.fresh or record != self.seen):
            return
        self.seen = record
        if self.callback is not None:
            self.callback(record)
            return
        self.latest = record
        assert self.ready is not None
        self.ready.set()

    def restart(self) -> None:
        """Yield the record again at the next offer: a reconnection, as the contract asks."""
        self.seen = _UNSEEN

    def end(self) -> None:
        self.ended = True
        if self.ready is not None:
            self.ready.set()

    async def records(self) -> AsyncIterator[LeaseRecord | None]:
        """Every record offered (the newest, when several came between two reads), until
        `end`. For a subscription without a callback."""
        ready = self.ready
        assert ready is not None  # (a subscription without a callback wakes through its event)
        while True:
            await ready.wait()
            if self.ended:
                return
            ready.clear()
            yield self.latest
