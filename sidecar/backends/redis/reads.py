"""The records the watches read, many leases per request.

A watch reads its lease's record whenever its channel is (re)subscribed: at start-up, after
every reconnection of the pub/sub connection, on a new master. A sidecar that follows 10,000
leases then asked for 10,000 records at once, one script each, and spent the CPU its renewals
needed on round trips (ten such replicas on two cores lost hundreds of leases to
their deadlines at start-up). `WatchReads` queues the reads and sends them together: one
script (`scripts.READ_MANY`) per `MOST` leases, at most `slots` of them in flight, the rest of
the client's connections left to acquires and renewals. A lease's answer, or its failure, is
its own; a request that fails fails every read in it, and each watch retries on its own
back-off (`RedisLease.read_until_it_answers`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sidecar.backends.base import LeaseRecord, StoreError
from sidecar.backends.redis.scripts import lease_keys

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

T = TypeVar("T")


class ReadSource(Protocol):
    """What the reads need of their client's connection (`connection.RedisConnection`)."""

    request_timeout: float
    read_many_script: AsyncScript

    def borrowed(self) -> AbstractAsyncContextManager[Redis]: ...
    def record_in(self, lease: str, reply: list[Any]) -> LeaseRecord | StoreError | None: ...
    async def guarded(self, work: Callable[[], Awaitable[T]], key: str) -> T: ...


class _Read:
    """One caller's read: where its answer goes, and whom to tell when it is sent."""

    __slots__ = ("answer", "sent")

    def __init__(self, sent: Callable[[], None] | None) -> None:
        self.answer: asyncio.Future[LeaseRecord | None] = asyncio.get_running_loop().create_future()
        self.sent = sent


class WatchReads:
    # Leases per request: a reply of up to ~100 KB, and a script that holds the server for
    # well under a millisecond.
    MOST = 256

    def __init__(self, client: ReadSource, slots: int) -> None:
        self._client = client
        self._slots = asyncio.Semaphore(slots)
        self._queued: dict[str, list[_Read]] = {}  # lease → its callers, oldest lease first
        self._sender: asyncio.Task[None] | None = None
        self._out: dict[asyncio.Task[None], list[tuple[str, list[_Read]]]] = {}  # batches sent

    async def read(self, lease: str, sent: Callable[[], None] | None = None) -> LeaseRecord | None:
        """The record of ``lease``, as `RedisLease.read` returns it (tagged), raising what it
        raises (`StoreError`; `TimeoutError` when the request outlived its time). ``sent`` is
        called when the request that carries the read is sent: an answer is at least as new
        as whatever the caller heard about the lease before then. Waiting in the queue is not
        timed: the queue moves as fast as the store answers."""
        read = _Read(sent)
        self._queued.setdefault(lease, []).append(read)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_queued())
        return await read.answer  # (a caller cancelled here cancels its answer: skipped)

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

    def _take(self) -> list[tuple[str, list[_Read]]]:
        """Up to `MOST` leases off the queue, each with the callers still waiting."""
        batch = []
        for lease in list(islice(self._queued, self.MOST)):
            waiting = [read for read in self._queued.pop(lease) if not read.answer.done()]
            if waiting:
                batch.append((lease, waiting))
        return batch

    async def _send(self, batch: list[tuple[str, list[_Read]]]) -> None:
        client = self._client
        keys: list[str] = []
        for lease, _ in batch:
            keys += lease_keys(lease)[:2]

        async def work() -> list[LeaseRecord | StoreError | None]:
            async with client.borrowed() as conn:
                for _, reads in batch:
                    for read in reads:
                        if read.sent is not None:
                            read.sent()
                reply = await client.read_many_script(keys=keys, client=conn)
                # Tagged with the epoch of the moment the reply came, as `RedisLease.read`
                # does: a reconnection after it is not one these records outlived.
                return [
                    client.record_in(lease, reply[3 * i : 3 * i + 3])
                    for i, (lease, _) in enumerate(batch)
                ]

        try:
            answers = await asyncio.wait_for(
                client.guarded(work, "the leases' holder keys"), client.request_timeout
            )
        except (StoreError, TimeoutError) as exc:
            for _, reads in batch:
                for read in reads:
                    _settle(read, exc)
        except BaseException as exc:
            # Cancelled (the client closes), or a bug: no caller is left waiting for ever.
            cancelled = isinstance(exc, asyncio.CancelledError)
            for _, reads in batch:
                for read in reads:
                    if cancelled:
                        read.answer.cancel()
                    else:
                        _settle(read, exc)
            raise
        else:
            for (_, reads), answer in zip(batch, answers, strict=True):
                for read in reads:
                    _settle(read, answer)
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
            for _, reads in batch:
                for read in reads:
                    read.answer.cancel()
        self._queued.clear()


def _settle(read: _Read, outcome: LeaseRecord | BaseException | None) -> None:
    if read.answer.done():  # its caller gave up
        return
    if isinstance(outcome, BaseException):
        read.answer.set_exception(outcome)
        read.answer.exception()  # retrieved: its caller may be gone (cancelled) by now
    else:
        read.answer.set_result(outcome)
