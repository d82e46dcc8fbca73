"""The fake cluster's storage: objects, one global resourceVersion counter (etcd's revision,
shared by every resource type), and the event history that watches replay and follow."""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
from collections.abc import Iterator

from tests.fakekube.wire import JsonObj

Key = tuple[tuple[str, str, str], str, str]  # (resource, namespace, name)

VOLATILE_METADATA = ("resourceVersion", "managedFields", "generation")


@dataclasses.dataclass(frozen=True)
class Change:
    """One write, as a watch reports it. ``obj`` carries kind/apiVersion and the RV of the
    write (for DELETED: the last state with the RV of the deletion)."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    resource: tuple[str, str, str]
    namespace: str
    name: str
    obj: JsonObj


class TooOld(Exception):
    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


class Cluster:
    """Everything the fake API server stores. Single-threaded: used from one event loop."""

    def __init__(self, start_rv: int = 100, history: int = 5000) -> None:
        self.rv = start_rv
        self.floor = start_rv  # a watch from an RV below this is answered 410 Expired
        self.objects: dict[Key, JsonObj] = {}
        self.namespaces: set[str] = {"default", "kube-system", "kube-public", "demo"}
        self._history: collections.deque[Change] = collections.deque()
        self._history_limit = history
        self._subscribers: set[asyncio.Queue[Change]] = set()

    # -- reads ------------------------------------------------------------------------------

    def get(self, resource: tuple[str, str, str], namespace: str, name: str) -> JsonObj | None:
        obj = self.objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, resource: tuple[str, str, str], namespace: str | None = None) -> list[JsonObj]:
        keys = sorted(
            key
            for key in self.objects
            if key[0] == resource and (namespace is None or key[1] == namespace)
        )
        return [copy.deepcopy(self.objects[key]) for key in keys]

    # -- writes -----------------------------------------------------------------------------

    def store(
        self, resource: tuple[str, str, str], namespace: str, name: str, obj: JsonObj
    ) -> tuple[JsonObj, bool]:
        """Create or replace. A write that changes nothing keeps the resourceVersion and
        emits no event, as the real server does. Returns (stored object, written?)."""
        key = (resource, namespace, name)
        old = self.objects.get(key)
        if old is not None and _same(old, obj):
            return copy.deepcopy(old), False
        self.rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = stored
        self._emit(
            Change(
                self.rv,
                "MODIFIED" if old else "ADDED",
                resource,
                namespace,
                name,
                copy.deepcopy(stored),
            )
        )
        return copy.deepcopy(stored), True

    def delete(self, resource: tuple[str, str, str], namespace: str, name: str) -> JsonObj:
        """Remove; the DELETED event carries the last state with the RV of the deletion."""
        key = (resource, namespace, name)
        last = self.objects.pop(key)
        self.rv += 1
        last["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(Change(self.rv, "DELETED", resource, namespace, name, copy.deepcopy(last)))
        return last

    def bump(self) -> int:
        """A write elsewhere in the cluster (another resource type) moves the global counter."""
        self.rv += 1
        return self.rv

    def compact(self) -> int:
        """Forget the history: every older RV becomes too old to watch from (410)."""
        self._history.clear()
        self.floor = self.rv
        return self.floor

    # -- watching ---------------------------------------------------------------------------

    def changes_since(self, rv: int) -> Iterator[Change]:
        """Recorded changes after ``rv``; raises `TooOld` if they were compacted away."""
        if rv < self.floor:
            raise TooOld(rv, self.floor)
        return (change for change in list(self._history) if change.rv > rv)

    def subscribe(self) -> asyncio.Queue[Change]:
        queue: asyncio.Queue[Change] = asyncio.Queue()
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Change]) -> None:
        self._subscribers.discard(queue)

    def _emit(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self.floor = self._history.popleft().rv
        for queue in self._subscribers:
            queue.put_nowait(change)


def _same(old: JsonObj, new: JsonObj) -> bool:
    def strip(obj: JsonObj) -> JsonObj:
        clean = copy.deepcopy(obj)
        for field in VOLATILE_METADATA:
            clean.get("metadata", {}).pop(field, None)
        return clean

    return strip(old) == strip(new)
