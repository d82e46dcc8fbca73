"""One watch stream for many Leases: a namespace list/watch by label, fanned out by name.

A sidecar serving 1,000 leases cannot hold 1,000 watch streams: each is an HTTP connection, the
client's pool holds 100, and the API server pays for every one. `SharedLeaseWatch` runs one
list-then-watch of the Leases carrying ``leader-sidecar/group=<group>`` (which every write of a
sidecar in that group puts on the Lease) and hands each event to the subscribers of that Lease's
name. What every subscriber sees is what a watch of its one Lease would see:

* the Lease's state once after every (re)connection, i.e. after every list, present or not
  (a subscriber that joins a connected watch gets the state last seen at once);
* then every ADDED/MODIFIED of it, and None when it is DELETED (or stops matching the label).

The stream runs while anyone subscribes and stops with the last subscriber.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.reflector import CLIENT_GO, Listed, Pacing, Reflector
from sidecar.backends.kubernetes.watch import Selection
from sidecar.supervisor import Supervisor

Queue = asyncio.Queue[Any]


class SharedLeaseWatch:
    """The Leases of ``selection`` (a namespace and a label selector), for many subscribers."""

    def __init__(
        self,
        api: KubeApi,
        selection: Selection,
        *,
        watch_timeout: float = 60.0,
        rng: random.Random | None = None,
        supervisor: Supervisor | None = None,
        pacing: Pacing = CLIENT_GO,
    ) -> None:
        self.api = api
        self._supervisor = supervisor or Supervisor()  # restarts the stream if it fails
        self.selection = selection
        self.watch_timeout = watch_timeout
        self._rng = rng or random.Random()
        self._pacing = pacing
        self._subscribers: dict[str, set[Queue]] = {}
        # The Leases as last listed and watched, by name; None until the first list answers.
        self._cache: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped: list[asyncio.Task[None]] = []  # cancelled runs, awaited by `close`

    async def subscribe(self, name: str) -> AsyncIterator[Any]:
        """The Lease ``name`` (its JSON, or None when it does not exist) on every change."""
        queue: Queue = asyncio.Queue()
        self._subscribers.setdefault(name, set()).add(queue)
        if self._cache is not None:
            queue.put_nowait(self._cache.get(name))
        if self._task is None:
            self._task = self._supervisor.spawn("kubernetes-leases-watch", self._run)
        try:
            while True:
                yield await queue.get()
        finally:
            queues = self._subscribers.get(name, set())
            queues.discard(queue)
            if not queues:
                self._subscribers.pop(name, None)
            if not self._subscribers:
                self._stop()

    def _stop(self) -> None:
        """No one listens: end the stream (the next subscriber lists again)."""
        if self._task is not None:
            self._task.cancel()
            self._stopped = [task for task in self._stopped if not task.done()]
            self._stopped.append(self._task)
            self._task = None
        self._cache = None

    def _publish(self, name: str, lease: Any) -> None:
        for queue in self._subscribers.get(name, ()):
            queue.put_nowait(lease)

    async def _run(self) -> None:
        reflector = Reflector(
            self.api,
            self.selection,
            f"leases {self.selection.label_selector}",
            watch_timeout=self.watch_timeout,
            pacing=self._pacing,
            rng=self._rng,
        )
        async with contextlib.aclosing(reflector.events()) as events:
            async for event in events:
                if isinstance(event, Listed):
                    self._cache = {_name(lease): lease for lease in event.items}
                    for name in list(self._subscribers):
                        self._publish(name, self._cache.get(name))
                else:
                    self._apply(event.kind, event.obj)

    def _apply(self, kind: str, lease: dict[str, Any]) -> None:
        name = _name(lease)
        cache = self._cache if self._cache is not None else {}
        if kind == "DELETED":
            cache.pop(name, None)
            self._publish(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            cache[name] = lease
            self._publish(name, lease)

    async def close(self) -> None:
        self._stop()
        stopped, self._stopped = self._stopped, []
        await asyncio.gather(*stopped, return_exceptions=True)


def _name(lease: dict[str, Any]) -> str:
    return str((lease.get("metadata") or {}).get("name"))
