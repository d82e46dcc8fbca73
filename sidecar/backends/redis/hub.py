"""One pub/sub connection for every watched lease of a client, fanning messages out to the
watches: a thousand leases must not mean a thousand subscriber connections.

The hub task alone touches the connection: watches `join` and `leave` by channel, and the
task (un)subscribes between short polls. A watch learns two things from its `Mailbox`: the
newest message on its channel, or that its channel was (re)subscribed — confirmed by the
server — after which it reads the record, so nothing published while it was not subscribed
is missed. Each server confirmation of a channel already confirmed on this connection means
redis-py reconnected it on its own; like any reconnection, that bumps the client's epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from sidecar.backends.base import LeaseRecord
from sidecar.backends.kit.backoff import Backoff, reconnect_forever

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub

    from sidecar.backends.base import StoreUnavailable
    from sidecar.supervisor import Supervisor


class HubSource(Protocol):
    """What the hub needs of its client's connection (`connection.RedisConnection`)."""

    WATCH_BACKOFF: tuple[float, float]
    supervisor: Supervisor
    redis: Redis
    request_timeout: float
    master_generation: int
    epoch: int

    def follow_sentinels(self) -> None: ...
    def unavailable(self, exc: BaseException, key: str) -> StoreUnavailable: ...


# A key a foreign value could be in, for the hub's error messages: it reads no key itself.
_NO_KEY = "the leases' event channels"


class WatchCallbackFailed(Exception):
    """A watch's callback (`Follower`) raised on a message: a bug, not the connection's fault.
    The hub then fails under its supervisor — logged with the traceback, counted in
    ``task_failures_total{task="redis-pubsub"}``, restarted after its back-off — instead of
    passing for a Redis outage (`FollowsByCall`)."""


class Mailbox:
    """One watch's view of its channel. Holds only the newest message (coalescing is allowed:
    each message is a whole record) and whether the channel was (re)subscribed since the
    watch last looked — a re-read then supersedes any message that came before it."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._resubscribed = False
        self._message: str | None = None
        self._ready = asyncio.Event()

    def subscribed(self) -> None:
        self._resubscribed = True
        self._message = None
        self._ready.set()

    def deliver(self, payload: str) -> None:
        if not self._resubscribed:
            self._message = payload
        self._ready.set()

    async def next(self) -> tuple[bool, str | None]:
        """(re-read needed, newest message): waits until there is something."""
        await self._ready.wait()
        self._ready.clear()
        taken = (self._resubscribed, self._message)
        self._resubscribed, self._message = False, None
        return taken


class FollowSource(Protocol):
    """What a `Follower` asks of the lease it follows (`RedisLease`)."""

    def message_record(self, payload: str) -> LeaseRecord | None:
        """A published message as the record (tagged); None if it is not one."""

    async def read_until_it_answers(
        self, sent: Callable[[], None] | None = None
    ) -> LeaseRecord | None:
        """The record, retried until the store answers; ``sent`` is called each time the
        request that reads it is sent."""

    def spawn(self, name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        """``work`` as a supervised task."""

    def unfollow(self, follower: Follower) -> None:
        """``follower`` stopped: off the hub."""


class Follower:
    """One watch as calls (`FollowsByCall`): a 1,000-lease sidecar then runs no task per
    lease. Each message is decoded and handed on at once. A (re)subscription — or a message
    that is not a record — reads the record first, in a task of its own: messages that arrive
    before that read is sent (it may wait in `WatchReads`' queue for seconds) are superseded
    by it, and the newest of those that arrive while it is out is held and handed on after
    its record — unless the record shows it older (`_older`): a leader handed a stale record
    after its own newer grant would step down for nothing."""

    __slots__ = ("_callback", "_held", "_reading", "_source", "channel")

    def __init__(
        self,
        channel: str,
        callback: Callable[[LeaseRecord | None], None],
        source: FollowSource,
    ) -> None:
        self.channel = channel
        self._callback: Callable[[LeaseRecord | None], None] | None = callback
        # The lease's store itself, not three bound methods of it and a closure to stop:
        # a sidecar may follow 10,000 leases.
        self._source = source
        self._reading: asyncio.Task[None] | None = None
        self._held: str | None = None  # while a read is out: the newest message since it was sent

    def subscribed(self) -> None:
        self._reread()

    def deliver(self, payload: str) -> None:
        if self._callback is None:
            return
        if self._reading is not None:
            self._held = payload
            return
        self._hand_on(payload, self._callback)

    def _hand_on(
        self,
        payload: str,
        callback: Callable[[LeaseRecord | None], None],
        read: LeaseRecord | None = None,
    ) -> None:
        """The message's record to ``callback``, unless ``read`` (a record just handed on)
        shows it older; a message that is not a record: read the record instead."""
        record = self._source.message_record(payload)
        if record is None:  # something else published here: the read reports it
            self._reread()
        elif not _older(record, read):
            callback(record)

    def _reread(self) -> None:
        if self._callback is None:
            return
        if self._reading is not None:
            self._reading.cancel()  # (its record would be older than the one read next)
        self._held = None
        self._reading = self._source.spawn("redis-watch-read", self._read_and_call)

    async def _read_and_call(self) -> None:
        """Read, then hand on the record and what came while it was out. Run under the
        client's supervisor: a callback that raises here is counted and run again."""
        record = await self._source.read_until_it_answers(self._forget_held)
        callback = self._callback
        if callback is None:
            return
        self._reading = None
        try:
            callback(record)
            held = self._take_held()
            if held is not None:
                self._hand_on(held, callback, record)
        except BaseException:
            # A bug: the supervisor runs this read again, and until its record is handed on
            # a message waits for it (else it would go first, and the read's older record
            # after it), and a resubscription cancels it.
            if self._callback is not None:
                self._reading = asyncio.current_task()
            raise

    def _forget_held(self) -> None:
        """The read is sent: what came before is superseded by it."""
        self._held = None

    def _take_held(self) -> str | None:
        held, self._held = self._held, None
        return held

    def stop(self) -> None:
        """No more calls, and off the hub (what `FollowsByCall.follow` returns)."""
        self._callback = None
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        self._source.unfollow(self)


def _older(message: LeaseRecord, read: LeaseRecord | None) -> bool:
    """``message`` was surely written before ``read``: an earlier term, or a holder of the
    term that ``read`` shows released (nothing writes a term's holder after its release; after
    a loss marker the holder's renewal puts its grant back, at the same term). Terms only grow
    on one server; a server that lost writes means a new connection, and so a new read, not a
    message held across it. Records that cannot be read prove nothing."""
    if read is None or message.unreadable or read.unreadable:
        return False
    if message.term != read.term:
        return message.term < read.term
    return read.released and message.holder is not None


class ChannelHub:
    # How long the hub waits for a message before it looks at joins, leaves and a Sentinel
    # master switch: also the longest a new watch waits before it is subscribed.
    POLL = 0.05

    def __init__(self, client: HubSource) -> None:
        self._client = client
        # Per channel, its watches: nearly always one, so a list (64 bytes) and not a set
        # (216): a sidecar may watch 10,000 channels.
        self._mailboxes: dict[str, list[Mailbox | Follower]] = {}
        self._confirmed: set[str] = set()  # channels the server confirmed on this connection
        self._pubsub: PubSub | None = None  # the connection being served
        self._joined = 0  # bumped when a channel is watched or no longer is: resubscribe
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connections = 0  # pub/sub connections opened so far (for tests and logs)

    def join(self, channel: str) -> Mailbox:
        mailbox = Mailbox(channel)
        self._add(mailbox)
        return mailbox

    def follow(self, follower: Follower) -> None:
        """A watch as calls (`Follower`), until `leave`."""
        self._add(follower)

    def _add(self, mailbox: Mailbox | Follower) -> None:
        channel = mailbox.channel
        watchers = self._mailboxes.setdefault(channel, [])
        if mailbox not in watchers:
            watchers.append(mailbox)
        self._joined += 1
        if channel in self._confirmed:
            mailbox.subscribed()  # already subscribed here: read now
        self._wake.set()
        if self._task is None:
            self._client.follow_sentinels()
            self._task = self._client.supervisor.spawn("redis-pubsub", self._run)

    def subscribed(self, channel: str) -> bool:
        """The server confirmed ``channel`` on the connection that is up now."""
        return channel in self._confirmed

    def leave(self, mailbox: Mailbox | Follower) -> None:
        watchers = self._mailboxes.get(mailbox.channel)
        if watchers is not None and mailbox in watchers:
            watchers.remove(mailbox)
            if not watchers:
                del self._mailboxes[mailbox.channel]
                self._joined += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        """Keep one subscription to every watched channel until cancelled. Raises only when a
        watch's callback did (`WatchCallbackFailed`): its supervisor then restarts it."""
        await reconnect_forever(
            self._connect,
            backoff=Backoff(*self._client.WATCH_BACKOFF),
            failed=self._failed,
            wanted=self._until_watched,
            opening=self._opening,
            closed=self._closed,
            fatal=(WatchCallbackFailed,),
        )

    async def _until_watched(self) -> None:
        while not self._mailboxes:  # nobody watches: no connection either
            self._wake.clear()
            await self._wake.wait()

    def _failed(self, exc: Exception) -> None:
        self._client.epoch += 1  # the server may have restarted and lost writes
        self._client.unavailable(exc, _NO_KEY)  # logs once per distinct problem

    def _opening(self) -> None:
        self._pubsub = self._client.redis.pubsub()
        self.connections += 1

    async def _connect(self) -> None:
        assert self._pubsub is not None
        try:
            await self._serve(self._pubsub)
        except WatchCallbackFailed:
            # A bug in a callback: the supervisor logs, counts and restarts the hub, whose
            # new connection has every watch read its record again. A reconnection all the
            # same: messages go unseen meanwhile, so a new epoch too.
            self._client.epoch += 1
            raise

    async def _closed(self) -> None:
        self._confirmed = set()
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    async def _serve(self, pubsub: PubSub) -> None:
        """One connection's life: until it fails, the Sentinels switch master (then the
        caller opens a new one there), or nobody watches any more."""
        client = self._client
        generation = client.master_generation
        sent: set[str] = set()
        synced = -1  # the `_joined` the subscriptions match
        while generation == client.master_generation and self._mailboxes:
            if synced != self._joined:  # (comparing 1,000 channels per message cost 3 % CPU)
                synced = self._joined
                await self._sync(pubsub, sent)
            message = await pubsub.get_message(timeout=self.POLL)
            if message is None:
                continue
            kind, channel = message.get("type"), message.get("channel")
            if kind == "subscribe":
                if channel in self._confirmed:
                    # redis-py reconnected and resubscribed by itself (`PubSub.on_connect`):
                    # messages may have been missed, and the server may have lost writes.
                    client.epoch += 1
                    self._confirmed.clear()
                self._confirmed.add(channel)
                for mailbox in tuple(self._mailboxes.get(channel, ())):
                    mailbox.subscribed()
            elif kind == "unsubscribe":
                self._confirmed.discard(channel)
            elif kind == "message":
                try:
                    for mailbox in tuple(self._mailboxes.get(channel, ())):
                        mailbox.deliver(message["data"])
                except Exception as exc:
                    raise WatchCallbackFailed(
                        f"a watch of {channel} failed on a message: {type(exc).__name__}: {exc}"
                    ) from exc

    async def _sync(self, pubsub: PubSub, sent: set[str]) -> None:
        """Subscribe the channels watches joined, unsubscribe those nobody watches: one
        command each way, however many channels. The confirmations arrive as messages."""
        wanted = set(self._mailboxes)
        timeout = self._client.request_timeout
        new = wanted - sent
        if new:
            await asyncio.wait_for(pubsub.subscribe(*sorted(new)), timeout)
            sent |= new
        gone = sent - wanted
        if gone:
            await asyncio.wait_for(pubsub.unsubscribe(*sorted(gone)), timeout)
            sent -= gone
            self._confirmed -= gone
