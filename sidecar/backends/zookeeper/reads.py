"""The followers' reads, many znodes per request.

A watch event carries no data, so a follower reads its lease after every change. A leader
renews all its leases in one ``multi``, and every other sidecar then hears of hundreds of
changes at once, one event each: one ``getData`` each were hundreds of requests per renew
interval per sidecar. `FollowerReads` queues the paths and reads them together, one
``multiRead`` (`ZooKeeperConnection.read_many`) of up to `MOST` paths, at most `SLOTS` of them
out at once, as `redis.reads.WatchReads` does with its scripts.

No timer holds a read back (rule 2: a follower times what it sees, so a read held back is a
change seen late). The first path of a burst is taken on the next turn of the event loop,
after every event the connection had already received; paths that come while the requests
are out wait only for one of them to answer. A read sent after an event answers what the
event told (the server sends an event before the answer to any later request that sees its
change); the caller reads again after an event that came while its read was out
(`store.ZooKeeperLease.follow`).
"""

from __future__ import annotations

import asyncio
from itertools import islice
from typing import TYPE_CHECKING, Protocol, TypeVar

from sidecar.backends.base import StoreError
from sidecar.backends.zookeeper.jute import Node

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from sidecar.backends.base import StoreUnavailable

T = TypeVar("T")


class ReadsMany(Protocol):
    """What the batches need of the connection (`ZooKeeperConnection`)."""

    @property
    def seen(self) -> Mapping[str, Node | None]: ...

    async def guarded(self, work: Callable[[], Awaitable[T]]) -> T: ...

    async def read_many(self, paths: Sequence[str]) -> list[Node | StoreUnavailable | None]: ...


_Batch = list[tuple[str, list["asyncio.Future[Node | None]"]]]
"""Paths to read, each with its callers' answers."""


class FollowerReads:
    # Paths per request: ~60 bytes each asked, ~300 answered for a lease's value.
    MOST = 1000
    # The answer a request may expect, by the sizes last seen (a path not seen: `UNSEEN`):
    # well under the most the session reads in one packet (`session.MAX_PACKET`), which a
    # few leases rewritten with large values by hand could otherwise pass.
    MOST_BYTES = 4 * 1024 * 1024
    UNSEEN = 1024
    PER_PATH = 100  # the path, the stat, the headers
    # Requests out at once: the next burst is sent while a large read is answered.
    SLOTS = 2

    def __init__(self, connection: ReadsMany) -> None:
        self._connection = connection
        self._slots = asyncio.Semaphore(self.SLOTS)
        self._queued: dict[str, list[asyncio.Future[Node | None]]] = {}  # oldest first
        self._sender: asyncio.Task[None] | None = None
        self._out: dict[asyncio.Task[None], _Batch] = {}  # the batches sent

    async def read(self, path: str) -> Node | None:
        """``path`` as `ZooKeeperConnection.read` answers it, read with the other paths
        queued: the znode, or None where it is absent. Raises `StoreError`."""
        answer: asyncio.Future[Node | None] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(path, []).append(answer)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_queued())
        return await answer  # (a caller cancelled here cancels its answer: skipped)

    async def _send_queued(self) -> None:
        try:
            while self._queued:
                await self._slots.acquire()
                batch = self._take()
                if not batch:
                    self._slots.release()
                    continue
                task = asyncio.create_task(self._send(batch))
                self._out[task] = batch
                task.add_done_callback(self._sent)
        finally:
            self._sender = None

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._out.pop(task, None)

    def _take(self) -> _Batch:
        """Up to `MOST` paths off the queue (and about `MOST_BYTES` of answer), each with
        the callers still waiting."""
        batch: _Batch = []
        size = 0
        for path in list(islice(self._queued, self.MOST)):
            seen = self._connection.seen.get(path)
            expected = self.PER_PATH + (self.UNSEEN if seen is None else len(seen.data))
            if batch and size + expected > self.MOST_BYTES:
                break
            waiting = [answer for answer in self._queued.pop(path) if not answer.done()]
            if waiting:
                batch.append((path, waiting))
                size += expected
        return batch

    async def _send(self, batch: _Batch) -> None:
        connection = self._connection
        try:
            answers = await connection.guarded(
                lambda: connection.read_many([path for path, _ in batch])
            )
        except StoreError as failed:
            for _, waiting in batch:
                for answer in waiting:
                    _settle(answer, failed)
        except BaseException:
            # Cancelled (the connection closes), or a bug: no caller is left waiting for ever.
            for _, waiting in batch:
                for answer in waiting:
                    answer.cancel()
            raise
        else:
            for (_, waiting), outcome in zip(batch, answers, strict=True):
                for answer in waiting:
                    _settle(answer, outcome)
        finally:
            self._slots.release()

    async def close(self) -> None:
        """Cancel every read, queued or out (a task cancelled before it ran settles none)."""
        out = dict(self._out)
        tasks = [*out, *([self._sender] if self._sender is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sender = None
        for batch in [*out.values(), list(self._queued.items())]:
            for _, waiting in batch:
                for answer in waiting:
                    answer.cancel()
        self._queued.clear()


def _settle(answer: asyncio.Future[Node | None], outcome: Node | StoreError | None) -> None:
    if answer.done():  # its caller gave up
        return
    if isinstance(outcome, StoreError):
        answer.set_exception(outcome)
        answer.exception()  # retrieved: its caller may be gone by now
    else:
        answer.set_result(outcome)
