"""The watch streams of one client, shared by every lease and candidate group it follows.

A stream is one streaming ``POST /v3/watch`` with one watcher over one key range: every lease
of the client shares the stream of ``PREFIX/lease/`` (a thousand leases mean one connection,
not a thousand), each followed candidate group has the stream of its own prefix. A
subscription is one key (a lease) or a prefix (a group) inside its stream's range; events of
other keys in the range (another sidecar's leases under the same prefix) are dropped here.

Why one watcher per stream: etcd's gateway answers while it still reads the request body,
and Go's HTTP/1 server then throws the unread rest of the body away, so the watchers of a
body with many ``create_request``s are created or lost at random (seen here with 100). A
websocket watch would take requests at any time, but etcd 3.4's websocket proxy cannot carry
an auth token (it forwards only ``Bearer <token>``, which etcd refuses). So: one request per
body, one body per stream.

Each stream's life, reflector-style:

1. **Read, then watch from there.** Every subscription's keys are read linearizably (read-only
   ``Txn``s of at most `MAX_TXN_OPS` ranges) and handed to it as they are; the watcher starts
   at the lowest revision read + 1, and each subscription takes only events after its own
   read, so no change between a read and the watch is missed or applied twice. A
   subscription that joins a running stream makes it list again (no new epoch: nothing
   broke); joins come at start, all together, and the hub waits `JOIN_BATCH` for them.
2. **Events** update each subscription's keys as they come (coalesced: a subscriber that is
   busy sees the newest state, never an old one after a new one).
3. **Any broken stream lists again** (an error, the end of the body, the watcher cancelled:
   ``ErrCompacted`` when its revision was compacted away, a permission refused), after a
   jittered back-off that doubles up to 30 s and starts over once a stream has stayed up
   `HEALTHY` seconds (a very short watch is a failure like any other, never a reason to
   reconnect at once). A broken stream starts a new epoch of the client: writes may have
   been missed, and etcd may have been restored behind it.
4. **A silent stream is checked.** A member cut off from its quorum keeps its streams open
   and quiet, and answers progress requests from its own stale state, so silence says
   nothing by itself: after `probe_every` seconds without a message the hub reads one key
   linearizably on the stream's endpoint; an error there (no leader, a timeout) breaks the
   stream, and the client moves to the next endpoint. A stream silent for `silence` seconds
   even so (a proxy holding a dead connection open) lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from sidecar.backends.base import StoreError
from sidecar.backends.etcd.api import EtcdError, b64
from sidecar.backends.etcd.records import MAX_TXN_OPS, KeyValue, chunks, range_op
from sidecar.backends.kit.backoff import Backoff
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.etcd.api import EtcdApi
    from sidecar.backends.etcd.target import EtcdTarget
    from sidecar.supervisor import Supervisor


class WatchSource(Protocol):
    """What the watch streams need of their client's connection (`connection.EtcdConnection`)."""

    api: EtcdApi
    target: EtcdTarget
    supervisor: Supervisor

    def lost_sight(self, why: str) -> None: ...
    async def call(self, op: str, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    async def read_ranges(
        self, ranges: list[tuple[bytes, bytes | None]]
    ) -> tuple[list[list[KeyValue]], int]: ...


logger = logging.getLogger("sidecar.etcd")

BACKOFF = (0.1, 30.0)  # seconds: the first retry, the longest
HEALTHY = 30.0  # a stream up this long starts the back-off over
JOIN_BATCH = 0.02  # seconds the hub waits for more subscriptions before it lists
MAX_LINE = 4 * 1024 * 1024  # bytes in one watch message; longer breaks the stream


class Subscription:
    """One key (``end`` None) or key range: what it holds now, and whether it is watched."""

    def __init__(self, key: bytes, end: bytes | None) -> None:
        self.key = key
        self.end = end
        self.state: dict[bytes, KeyValue] = {}
        self.since: int | None = None  # the revision it was last read at (None: not yet)
        self.as_of = 0  # the revision its state is current at (its read, or its last event)
        self.watching = False
        self._ready = asyncio.Event()

    def matches(self, key: bytes) -> bool:
        if self.end is None:
            return key == self.key
        return self.key <= key < self.end

    def snapshot(self, kvs: list[KeyValue], revision: int) -> None:
        self.state = {kv.key: kv for kv in kvs}
        self.since = self.as_of = revision
        self._ready.set()

    def apply(self, kind: str, kv: KeyValue) -> None:
        """One event, unless the last read already saw it (its revision is not after)."""
        if self.since is None or kv.mod_revision <= self.since:
            return
        if kind == "DELETE":
            self.state.pop(kv.key, None)
        else:
            self.state[kv.key] = kv
        self.as_of = max(self.as_of, kv.mod_revision)
        self._ready.set()

    async def next(self) -> tuple[dict[bytes, KeyValue], int]:
        """The keys as they are, and the revision they are current at, once something
        happened since the last call."""
        await self._ready.wait()
        self._ready.clear()
        return dict(self.state), self.as_of


class Broken(Exception):
    """The stream failed: list again after a back-off, in a new epoch."""


class Relist(Exception):
    """List again now, in the same epoch (silent too long, or a subscription joined)."""


@dataclasses.dataclass(eq=False)
class _Stream:
    key: bytes
    end: bytes
    subscriptions: list[Subscription] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None
    connected: bool = False
    joined: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class WatchHub:
    def __init__(
        self,
        client: WatchSource,
        *,
        silence: float,
        probe_every: float,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.silence = silence
        self.probe_every = probe_every
        self._rng = rng or random.Random()
        self._streams: dict[tuple[bytes, bytes], _Stream] = {}
        self.streams_opened = 0  # watch requests sent (tests count them)

    def join(self, key: bytes, end: bytes | None, *, within: tuple[bytes, bytes]) -> Subscription:
        """Follow ``key`` (or the range up to ``end``) on the stream of the range ``within``."""
        subscription = Subscription(key, end)
        stream = self._streams.get(within)
        if stream is None:
            stream = _Stream(*within)
            self._streams[within] = stream
        stream.subscriptions.append(subscription)
        if stream.task is None:
            stream.task = self.client.supervisor.spawn("etcd-watch", lambda: self._run(stream))
        else:
            stream.joined.set()  # list again (once the joins of this moment are in)
        return subscription

    def watching(self, key: bytes) -> bool:
        """Some subscription of ``key`` is watched now (its stream is up)."""
        return any(
            s.watching for stream in self._streams.values() for s in stream.subscriptions
            if s.key == key
        )  # fmt: skip

    def leave(self, subscription: Subscription) -> None:
        subscription.watching = False
        for within, stream in list(self._streams.items()):
            if subscription in stream.subscriptions:
                stream.subscriptions.remove(subscription)
                if not stream.subscriptions:
                    del self._streams[within]
                    if stream.task is not None:
                        stream.task.cancel()

    async def close(self) -> None:
        tasks = [s.task for s in self._streams.values() if s.task is not None]
        self._streams = {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one stream ---------------------------------------------------------------------------

    async def _run(self, stream: _Stream) -> None:
        """List, watch, and again after every break, until cancelled; never raises."""
        failures = 0
        backoff = Backoff(*BACKOFF, rng=self._rng)
        while True:
            await asyncio.sleep(JOIN_BATCH)
            stream.joined.clear()
            opened = time.monotonic()
            try:
                await self._follow(stream)
            except asyncio.CancelledError:
                raise
            except Relist as relist:
                log(logger, "debug", "etcd watch lists again", why=str(relist))
                continue
            except Exception as exc:  # Broken, StoreError, bad JSON, ...
                was_connected = stream.connected
                if time.monotonic() - opened >= HEALTHY:
                    failures = 0
                    backoff.succeeded()
                failures += 1
                delay = backoff.failed()
                if was_connected:
                    self.client.lost_sight(f"the watch stream broke: {exc}")
                log(
                    logger,
                    "warning" if failures in (3, 10) or failures % 50 == 0 else "debug",
                    "etcd watch interrupted; listing again",
                    error=str(exc),
                    failures=failures,
                    retry_in_seconds=round(delay, 3),
                )
                await asyncio.sleep(delay)
            finally:
                stream.connected = False
                for subscription in stream.subscriptions:
                    subscription.watching = False

    async def _follow(self, stream: _Stream) -> None:
        """One connection: read every subscription, watch the range from there. Raises
        `Broken` or `Relist`."""
        subscriptions = list(stream.subscriptions)
        start = await self._read(subscriptions)
        create = {
            "key": b64(stream.key),
            "range_end": b64(stream.end),
            "start_revision": str(start + 1),
            "progress_notify": True,
        }
        body = json.dumps({"create_request": create}, separators=(",", ":")).encode() + b"\n"
        api = self.client.api
        self.streams_opened += 1
        try:
            async with (
                api.stream("watch", "/v3/watch", body) as content,
                contextlib.aclosing(self._results(stream, content, api.current)) as results,
            ):
                stream.connected = True
                async for result in results:
                    if result.get("canceled"):
                        compacted = int(result.get("compact_revision") or 0)
                        if compacted:
                            raise Broken(f"revision compacted (etcd compacted to {compacted})")
                        reason = result.get("cancel_reason") or "no reason given"
                        raise Broken(f"etcd cancelled the watch: {reason}")
                    if result.get("created"):
                        for subscription in subscriptions:
                            subscription.watching = True
                        continue
                    for event in result.get("events") or []:
                        kv = KeyValue.decode(event.get("kv") or {})
                        kind = str(event.get("type") or "PUT")
                        for subscription in subscriptions:
                            if subscription.matches(kv.key):
                                subscription.apply(kind, kv)
        except EtcdError as error:
            raise Broken(str(error)) from error
        raise Broken("the watch stream ended")

    async def _read(self, subscriptions: list[Subscription]) -> int:
        """Every subscription's keys, read linearizably and handed over; the lowest revision
        read (the watch starts after it)."""
        lowest: int | None = None
        for chunk in chunks(subscriptions, MAX_TXN_OPS):
            found, revision = await self.client.read_ranges([(s.key, s.end) for s in chunk])
            for subscription, kvs in zip(chunk, found, strict=True):
                subscription.snapshot(kvs, revision)
            lowest = revision if lowest is None else min(lowest, revision)
        return lowest or 0

    async def _results(
        self, stream: _Stream, content: aiohttp.StreamReader, endpoint: int
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The stream's results, one JSON message per line. Checks a silent stream (see the
        module docstring), lists again when a subscription joined; raises `Broken` or
        `Relist`."""
        buffer = bytearray()
        quiet_since = time.monotonic()
        joined = asyncio.ensure_future(stream.joined.wait())
        reading: asyncio.Future[bytes] | None = None
        try:
            while True:
                reading = asyncio.ensure_future(content.readany())
                done, _ = await asyncio.wait(
                    {reading, joined}, timeout=self.probe_every, return_when="FIRST_COMPLETED"
                )
                if reading not in done:
                    reading.cancel()
                    await asyncio.gather(reading, return_exceptions=True)
                    if joined in done:
                        raise Relist("a subscription joined")
                    await self._probe(endpoint)
                    if time.monotonic() - quiet_since >= self.silence:
                        raise Relist(f"no message for {self.silence:g}s")
                    continue
                try:
                    chunk = reading.result()
                except Exception as exc:  # aiohttp payload/connection errors
                    raise Broken(f"{type(exc).__name__}: {exc}") from exc
                if not chunk:
                    raise Broken("the watch stream ended")
                quiet_since = time.monotonic()
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    result = message.get("result") if isinstance(message, dict) else None
                    if not isinstance(result, dict):
                        raise Broken(f"the watch answered an error: {line[:300]!r}")
                    yield result
                if len(buffer) > MAX_LINE:
                    raise Broken(f"a watch message longer than {MAX_LINE} bytes; refused")
        finally:
            for pending in (joined, reading):
                if pending is not None:
                    pending.cancel()
            await asyncio.gather(
                *(f for f in (joined, reading) if f is not None), return_exceptions=True
            )

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
