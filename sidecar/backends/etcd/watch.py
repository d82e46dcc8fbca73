"""The watch streams of one client, shared by every lease and candidate group it follows.

A subscription is one key (a lease) or one prefix (a candidate group). Subscriptions that join
together (a sidecar opens every lease's watch at start) share one stream: one streaming
``POST /v3/watch`` whose body carries a ``create_request`` per subscription, so a thousand
leases mean one connection, not a thousand. (etcd 3.4's gateway serves a websocket for
watches too, where requests could be added later, but it cannot carry an auth token; a
streaming POST can, so every watch uses it.) A subscription that joins later (the candidates
of a replica that just became leader) gets a stream of its own.

Each stream's life, reflector-style:

1. **Read, then watch from there.** Every subscription's keys are read linearizably (a
   read-only ``Txn``, at most `MAX_TXN_OPS` ranges each) and handed to it as they are; its
   watcher then starts at the revision of that read + 1, so no change between the read and
   the watch is missed.
2. **Events** update each subscription's keys as they come (coalesced: a subscriber that is
   busy sees the newest state, never an old one after a new one).
3. **Any broken stream lists again** (an error, the end of the body, a watcher cancelled:
   ``ErrCompacted`` when its revision was compacted away, a permission refused), after a
   jittered back-off that doubles up to 30 s and starts over once a stream has stayed up
   `HEALTHY` seconds; a stream that ends within a second with no event is a failure, never a
   reason to reconnect at once. A broken stream starts a new epoch of the client: writes may
   have been missed, and etcd may have been restored behind it.
4. **A silent stream is checked.** A member cut off from its quorum keeps its streams open
   and quiet, and answers watch progress requests from its own stale state, so silence alone
   says nothing: after `probe_every` seconds without a message the hub reads one key
   linearizably on the same endpoint; an error there (no leader, a timeout) breaks the
   stream and the client moves to the next endpoint. A stream silent for `silence` seconds
   even so (a proxy that holds a dead connection open) is listed again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import aiohttp

from sidecar.backends.base import StoreError
from sidecar.backends.etcd.api import EtcdError, b64
from sidecar.backends.etcd.records import KeyValue, range_op
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.etcd.client import EtcdStoreClient

logger = logging.getLogger("sidecar.etcd")

BACKOFF = (0.1, 30.0)  # seconds: the first retry, the longest
HEALTHY = 30.0  # a stream up this long resets the back-off
JOIN_BATCH = 0.02  # joins this close together share one stream
MAX_LINE = 4 * 1024 * 1024  # bytes in one watch message; longer breaks the stream


class Subscription:
    """One key or prefix: what it holds now, and whether its stream is watching it."""

    def __init__(self, key: bytes, end: bytes | None) -> None:
        self.key = key
        self.end = end
        self.state: dict[bytes, KeyValue] = {}
        self.watching = False
        self._ready = asyncio.Event()

    def snapshot(self, kvs: list[KeyValue]) -> None:
        self.state = {kv.key: kv for kv in kvs}
        self._ready.set()

    def apply(self, kind: str, kv: KeyValue) -> None:
        if kind == "DELETE":
            self.state.pop(kv.key, None)
        else:
            self.state[kv.key] = kv
        self._ready.set()

    async def next(self) -> dict[bytes, KeyValue]:
        """The keys as they are, once something happened since the last call."""
        await self._ready.wait()
        self._ready.clear()
        return dict(self.state)


class Broken(Exception):
    """The stream failed: list again after a back-off, in a new epoch."""


class Relist(Exception):
    """The stream is no longer worth following (silent too long): list again now."""


@dataclasses.dataclass
class _Stream:
    subscriptions: list[Subscription]
    task: asyncio.Task[None] | None = None


class WatchHub:
    def __init__(
        self,
        client: EtcdStoreClient,
        *,
        silence: float,
        probe_every: float,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.silence = silence
        self.probe_every = probe_every
        self._rng = rng or random.Random()
        self._streams: list[_Stream] = []
        self._pending: list[Subscription] = []
        self._batching: asyncio.Task[None] | None = None
        self.streams_opened = 0  # for tests and logs

    def join(self, key: bytes, end: bytes | None) -> Subscription:
        subscription = Subscription(key, end)
        self._pending.append(subscription)
        if self._batching is None or self._batching.done():
            self._batching = asyncio.create_task(self._start_batch(), name="etcd-watch-batch")
        return subscription

    def watching(self, key: bytes) -> bool:
        """Some subscription of ``key`` is watched now (its stream is up)."""
        return any(
            s.watching for stream in self._streams for s in stream.subscriptions if s.key == key
        )

    def leave(self, subscription: Subscription) -> None:
        subscription.watching = False
        if subscription in self._pending:
            self._pending.remove(subscription)
            return
        for stream in list(self._streams):
            if subscription in stream.subscriptions:
                stream.subscriptions.remove(subscription)
                if not stream.subscriptions:
                    self._streams.remove(stream)
                    if stream.task is not None:
                        stream.task.cancel()

    async def _start_batch(self) -> None:
        await asyncio.sleep(JOIN_BATCH)
        batch, self._pending = self._pending, []
        if batch:
            stream = _Stream(batch)
            stream.task = self.client.supervisor.spawn("etcd-watch", lambda: self._run(stream))
            self._streams.append(stream)

    async def close(self) -> None:
        tasks = [s.task for s in self._streams if s.task is not None]
        if self._batching is not None:
            tasks.append(self._batching)
        self._streams, self._pending = [], []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one stream ---------------------------------------------------------------------------

    async def _run(self, stream: _Stream) -> None:
        """Read, watch, and again after every break, until cancelled; never raises."""
        failures = 0
        while True:
            opened = time.monotonic()
            events = 0
            try:
                starts = await self._read(stream.subscriptions)
                async for _ in self._watch(stream.subscriptions, starts):
                    events += 1
                    if time.monotonic() - opened >= HEALTHY:
                        failures = 0
            except asyncio.CancelledError:
                raise
            except Relist as relist:
                log(logger, "info", "etcd watch silent; listing again", why=str(relist))
                continue
            except Exception as exc:  # Broken, StoreError, EtcdError, bad JSON, ...
                lived = time.monotonic() - opened
                was_watching = any(s.watching for s in stream.subscriptions)
                for subscription in stream.subscriptions:
                    subscription.watching = False
                if was_watching:
                    self.client.lost_sight(f"the watch stream broke: {exc}")
                # A stream that lived long enough starts the back-off over; any shorter one,
                # a very short watch with no event above all, counts as one more failure.
                if lived >= HEALTHY:
                    failures = 0
                failures += 1
                delay = min(BACKOFF[1], BACKOFF[0] * 2 ** (failures - 1))
                delay *= self._rng.uniform(0.5, 1.0)
                log(
                    logger,
                    "warning" if failures in (3, 10) or failures % 50 == 0 else "debug",
                    "etcd watch interrupted; listing again",
                    error=str(exc),
                    failures=failures,
                    retry_in_seconds=round(delay, 3),
                )
                await asyncio.sleep(delay)
                continue
            # The server ended the stream cleanly: a failure too (etcd never does by itself).
            for subscription in stream.subscriptions:
                subscription.watching = False
            self.client.lost_sight("the watch stream ended")
            failures += 1
            await asyncio.sleep(BACKOFF[0] * self._rng.uniform(0.5, 1.0))

    async def _read(self, subscriptions: list[Subscription]) -> list[int]:
        """Every subscription's keys, read linearizably and handed over; the revision each
        watcher starts after."""
        from sidecar.backends.etcd.client import MAX_TXN_OPS

        starts: list[int] = []
        for chunk in _chunks(list(subscriptions), MAX_TXN_OPS):
            found, revision = await self.client.read_ranges([(s.key, s.end) for s in chunk])
            for subscription, kvs in zip(chunk, found, strict=True):
                subscription.snapshot(kvs)
                starts.append(revision)
        return starts

    async def _watch(self, subscriptions: list[Subscription], starts: list[int]) -> Any:
        """Follow the stream; yields once per event. Raises `Broken` or `Relist`."""
        creates = []
        for watch_id, (subscription, start) in enumerate(zip(subscriptions, starts, strict=True)):
            create: dict[str, Any] = {
                "key": b64(subscription.key),
                "start_revision": str(start + 1),
                "watch_id": str(watch_id + 1),
                "progress_notify": True,
            }
            if subscription.end is not None:
                create["range_end"] = b64(subscription.end)
            creates.append(json.dumps({"create_request": create}, separators=(",", ":")))
        body = ("\n".join(creates) + "\n").encode()
        by_id = {str(i + 1): s for i, s in enumerate(subscriptions)}
        self.streams_opened += 1
        api = self.client.api
        try:
            async with api.stream("watch", "/v3/watch", body) as content:
                endpoint = api.current
                async for message in self._messages(content, endpoint):
                    result = message.get("result")
                    if not isinstance(result, dict):
                        error = message.get("error") or message
                        raise Broken(f"the watch answered an error: {str(error)[:300]}")
                    watcher = by_id.get(str(result.get("watch_id") or "0"))
                    if result.get("canceled"):
                        compacted = int(result.get("compact_revision") or 0)
                        if compacted:
                            raise Broken(f"revision compacted (etcd compacted to {compacted})")
                        reason = result.get("cancel_reason") or "no reason given"
                        raise Broken(f"etcd cancelled the watch: {reason}")
                    if watcher is None:
                        continue  # a progress notification
                    if result.get("created"):
                        watcher.watching = True
                        continue
                    for event in result.get("events") or []:
                        kind = str(event.get("type") or "PUT")
                        watcher.apply(kind, KeyValue.decode(event.get("kv") or {}))
                        yield event
        except EtcdError as error:
            raise Broken(str(error)) from error

    async def _messages(self, content: aiohttp.StreamReader, endpoint: int) -> Any:
        """The stream's JSON messages, one per line. Checks a silent stream (see the module
        docstring); raises `Broken` or `Relist`."""
        buffer = bytearray()
        quiet_since = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.probe_every):
                    chunk = await content.readany()
            except TimeoutError:
                await self._probe(endpoint)
                if time.monotonic() - quiet_since >= self.silence:
                    raise Relist(f"no message for {self.silence:g}s") from None
                continue
            except Exception as exc:  # aiohttp payload/connection errors
                raise Broken(f"{type(exc).__name__}: {exc}") from exc
            if not chunk:
                raise Broken("the watch stream ended")
            quiet_since = time.monotonic()
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    message = json.loads(line)
                    if isinstance(message, dict):
                        yield message
            if len(buffer) > MAX_LINE:
                raise Broken(f"a watch message longer than {MAX_LINE} bytes; refused")

    async def _probe(self, endpoint: int) -> None:
        """One linearizable read on the stream's endpoint: does its member still have a
        quorum? Raises `Broken` if not (the client then moves on)."""
        api = self.client.api
        if api.current != endpoint:
            raise Broken("the client moved to another endpoint")
        probe = range_op(f"{self.client.target.prefix}/".encode())
        probe["count_only"] = True
        try:
            await self.client.call("probe", "/v3/kv/range", probe)
        except StoreError as exc:
            raise Broken(f"the watch's member does not answer: {exc}") from exc


def _chunks(items: list[Subscription], size: int) -> Iterator[list[Subscription]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
