"""One lease in Redis: the contract's requests (one script each, then ``WAIT`` with
``min_replicas``) and its watch. Everything it talks through — connections, the pub/sub hub,
the epoch, the Sentinels — belongs to its `RedisConnection`, shared by every lease."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sidecar.backends.base import HOLD_HOLDER, LeaseHeld, LeaseRecord, NotOwned, StoreError
from sidecar.backends.kit.backoff import Backoff
from sidecar.backends.kit.versions import new_version
from sidecar.backends.redis.connection import RedisConnection, ms
from sidecar.backends.redis.hub import Follower
from sidecar.backends.redis.scripts import granted, lease_keys, reply_record, value_record
from sidecar.backends.redis.target import RedisTarget


class RedisLease:
    """The store of lease ``name`` on ``client`` (the layout and the guarantees are in the
    package docstring). Cheap: it holds its keys; ``close`` ends nothing shared."""

    # The holder key's TTL, in leases (at least GC_MIN seconds): garbage collection only, so
    # a lease nobody uses any more disappears; never a reason to grant (rule 2).
    GC_LEASES = 20
    GC_MIN = 60.0

    # The channel is kept (the hub and redis-py key their subscriptions by it); the two keys
    # are made when used: a sidecar may hold 10,000 of these, and a batch makes its own.
    __slots__ = ("_channel", "client", "lease")

    def __init__(self, client: RedisConnection, name: str) -> None:
        self.client = client
        self.lease = name
        self._channel = lease_keys(name)[2]

    @property
    def _holder_key(self) -> str:
        return lease_keys(self.lease)[0]

    @property
    def _term_key(self) -> str:
        return lease_keys(self.lease)[1]

    # The client's settings, read where the single-lease store exposed them.
    @property
    def target(self) -> RedisTarget:
        return self.client.target

    @property
    def request_timeout(self) -> float:
        return self.client.request_timeout

    @property
    def min_replicas(self) -> int:
        return self.client.min_replicas

    @property
    def wait_timeout(self) -> float:
        return self.client.wait_timeout

    @property
    def description(self) -> str:
        return f"{self.client.description} lease={self.lease}"

    # -- the contract ---------------------------------------------------------------------

    def _keys(self) -> list[str]:
        return [self._holder_key, self._term_key]

    def _reply(self, reply: list[Any]) -> LeaseRecord | None:
        return self.client.tagged(reply_record(reply))

    async def read(self) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            async with self.client.borrowed() as conn:
                return self._reply(await self.client.read_script(keys=self._keys(), client=conn))

        return await self.client.guarded(work, self._holder_key)

    def _gc_ms(self, duration: float) -> int:
        return ms(max(self.GC_MIN, self.GC_LEASES * duration))

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        client = self.client
        wall = client.clock.wall().isoformat()
        stored = None if expected is None else client.untagged(expected)
        if expected is not None and stored is None:
            # Observed before the server may have lost writes: not a basis for a grant.
            current = await self.read()
            raise LeaseHeld("the lease was observed before the server restarted", current)

        async def work() -> LeaseRecord:
            async with client.borrowed() as conn:
                generation = client.master_generation
                args: list[str | int] = [
                    identity, ms(duration), min_term, wall, self._channel,
                    "" if stored is None else stored, new_version(),
                    self._gc_ms(duration),
                ]  # fmt: skip
                reply = await client.acquire_script(keys=self._keys(), args=args, client=conn)
                record = self._reply(reply)
                if not granted(reply):
                    raise LeaseHeld(f"the lease is not at version {expected}", record)
                assert record is not None
                client.check_same_master(generation)
                if client.min_replicas:
                    await self._confirm_durable(conn, "acquire", record, identity)
                return record

        return await client.guarded(work, self._holder_key)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        client = self.client
        wall = client.clock.wall().isoformat()

        async def work() -> LeaseRecord:
            async with client.borrowed() as conn:
                generation = client.master_generation
                args: list[str | int] = [
                    identity, term, ms(duration), wall, self._channel, new_version(),
                    self._gc_ms(duration),
                ]  # fmt: skip
                reply = await client.renew_script(keys=self._keys(), args=args, client=conn)
                record = self._reply(reply)
                if not granted(reply):
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                assert record is not None
                client.check_same_master(generation)
                if client.min_replicas:
                    await self._confirm_durable(conn, "renew", record, None)
                return record

        return await client.guarded(work, self._holder_key)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            async with self.client.borrowed() as conn:
                return await self._release_as(
                    conn, identity, term, publish=True, successor=successor
                )

        return await self.client.guarded(work, self._holder_key)

    @property
    def hands_over(self) -> bool:
        """Not with ``WAIT`` (a write counts only once replicas acknowledged it, which the
        successor, leading on the published write, cannot know), nor through Sentinels (a
        write to a master that was just switched away is published to the successor, and
        only the writer's client would notice the switch)."""
        return not self.client.min_replicas and not self.client.target.sentinel

    async def hand_over(
        self,
        identity: str,
        term: int,
        *,
        successor: str,
        handed: str,
        duration: float,
        min_term: int,
    ) -> LeaseRecord:
        client = self.client
        wall = client.clock.wall().isoformat()

        async def work() -> LeaseRecord:
            async with client.borrowed() as conn:
                args: list[str | int] = [
                    identity, term, successor, ms(duration), min_term, wall, self._channel,
                    new_version(), self._gc_ms(duration), handed,
                ]  # fmt: skip
                reply = await client.hand_over_script(keys=self._keys(), args=args, client=conn)
                record = self._reply(reply)
                if not granted(reply):
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                assert record is not None
                return record

        return await client.guarded(work, self._holder_key)

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            async with self.client.borrowed() as conn:
                args: list[str | int] = [term, self._channel, HOLD_HOLDER]
                reply = await self.client.mark_lost_script(
                    keys=self._keys(), args=args, client=conn
                )
                return self._reply(reply)

        return await self.client.guarded(work, self._holder_key)

    async def _release_as(
        self,
        conn: Redis,
        identity: str,
        term: int,
        *,
        publish: bool,
        successor: str | None = None,
    ) -> LeaseRecord | None:
        args: list[str | int] = [
            identity, term, self._channel, "1" if publish else "0", new_version(),
            # The release does not know the lease; keep its value as long as the longest GC
            # (20 minutes): until it goes, a starting replica may take the lease at once.
            self._gc_ms(self.GC_MIN), successor or "",
        ]  # fmt: skip
        reply = await self.client.release_script(keys=self._keys(), args=args, client=conn)
        record = self._reply(reply)
        if not granted(reply):
            raise NotOwned(f"not held by {identity} with term {term}", record)
        return record

    async def _confirm_durable(
        self, conn: Redis, op: str, record: LeaseRecord, release_as: str | None
    ) -> None:
        """``WAIT min_replicas``: the write counts only once that many replicas have it, so
        a failover to one of them cannot lose it. Too few → `StoreUnavailable` (fail closed).
        A grant that is not durable is deleted again at once (without waking the followers,
        who would only fail the same way): no holder is shown that is not leading, and its
        term stays used up. If the delete fails too, the key expires by its TTL."""
        client = self.client
        acked = int(await conn.wait(client.min_replicas, max(1, ms(client.wait_timeout))))
        if acked >= client.min_replicas:
            return
        undone = ""
        if release_as is not None:
            try:
                await self._release_as(conn, release_as, record.term, publish=False)
                undone = "; the grant was withdrawn"
            except (RedisError, NotOwned):
                undone = "; the followers will see it expire"
        raise client.fail(
            "warning",
            f"only {acked} of {client.min_replicas} replica(s) acknowledged the {op} of term "
            f"{record.term} within {client.wait_timeout:g}s (--redis-min-replicas); it does "
            f"not count{undone}",
            kind="too few replicas acknowledged",
        )

    # -- the watch ------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Yield every grant, renewal and release published on the lease's channel, through
        the client's one pub/sub connection. Whenever the channel is (re)subscribed — first,
        after a reconnection, on a new master — read and yield the current record too, so a
        message missed meanwhile cannot leave a follower waiting for a lease already free."""
        mailbox = self.client.hub.join(self._channel)
        try:
            while True:
                reread, payload = await mailbox.next()
                record = None
                if not reread and payload is not None:
                    # Something else published here? Then the read below reports it.
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        record = value_record(payload)
                if record is not None:
                    yield self.client.tagged(record)
                else:
                    yield await self.read_until_it_answers()
        finally:
            self.client.hub.leave(mailbox)

    def follow(self, callback: Callable[[LeaseRecord | None], None]) -> Callable[[], None]:
        """`watch` as calls of ``callback`` (`FollowsByCall`): no task per lease, the hub
        hands each message on as it comes; a (re)subscription reads first (`Follower`)."""
        follower = Follower(self._channel, callback, self)
        self.client.hub.follow(follower)
        return follower.stop

    # -- what a `Follower` asks of its lease (`FollowSource`) -------------------------------

    def message_record(self, payload: str) -> LeaseRecord | None:
        """A published record, tagged; None if the message is not one (then a read)."""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return self.client.tagged(value_record(payload))
        return None

    def spawn(self, name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        return self.client.supervisor.spawn(name, work)

    def unfollow(self, follower: Follower) -> None:
        self.client.hub.leave(follower)

    async def read_until_it_answers(
        self, sent: Callable[[], None] | None = None
    ) -> LeaseRecord | None:
        """The record, retried with backoff (never raises: the elector relies on the watch;
        each failure is logged once by the client and bumps its epoch). Read with the other
        watches' reads (`WatchReads`: a sidecar's every watch reads at its first subscription,
        10,000 at once for 10,000 leases); ``sent`` is called when a request is sent."""
        backoff = Backoff(*self.client.WATCH_BACKOFF)
        while True:
            try:
                return await self.client.watch_reads.read(self.lease, sent)
            except (StoreError, TimeoutError):
                await asyncio.sleep(backoff.failed())

    async def close(self) -> None:
        """Nothing to do: its watches end when their consumers cancel them, and the client
        owns the connections."""

    # -- helpers for operators and tests --------------------------------------------------

    async def delete_everything(self) -> None:
        """Drop the lease's keys, term counter included (a reset store)."""

        async def work() -> None:
            async with self.client.borrowed() as conn:
                await conn.delete(self._holder_key, self._term_key)

        await self.client.guarded(work, self._holder_key)
