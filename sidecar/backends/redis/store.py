"""The Redis lease store: its connections, the contract's requests (one script each, then
``WAIT`` with ``min_replicas``), and the watch on the lease's channel."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import RedisError

from sidecar.backends.base import (
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreError,
    StoreUnavailable,
)
from sidecar.backends.redis.errors import explain
from sidecar.backends.redis.scripts import (
    ACQUIRE,
    READ,
    RELEASE,
    RENEW,
    granted,
    lease_keys,
    reply_record,
    value_record,
)
from sidecar.backends.redis.sentinel import follow_sentinels
from sidecar.backends.redis.target import RedisTarget, join_host
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log

T = TypeVar("T")
logger = logging.getLogger("sidecar.redis")


# redis-py's default retries hide time from the elector, which retries against its own
# deadline. One immediate retry on a connection error only: it replaces a pooled socket that
# died while idle (a restarted server) without failing the request. Timeouts are not retried.
# Retrying a script is safe: acquire and renew are idempotent for the caller, and a repeated
# release answers NotOwned with the freed record.
_ONE_RECONNECT = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


class RedisLeaseStore:
    """One lease in Redis: a server, a TLS server, or the master a group of Sentinels names
    (the layout and the guarantees are in the package docstring)."""

    # Backoff of the watch's reconnection attempts.
    WATCH_BACKOFF = (0.05, 2.0)
    # The watch waits for a message at most this long before checking whether a Sentinel
    # announced a new master (then it resubscribes there).
    SWITCH_POLL = 0.1
    # The holder key's TTL, in leases (at least GC_MIN seconds): garbage collection only, so
    # a lease nobody uses any more disappears; never a reason to grant (rule 2).
    GC_LEASES = 20
    GC_MIN = 60.0

    def __init__(
        self,
        target: RedisTarget,
        lease: str,
        *,
        request_timeout: float = 2.0,
        min_replicas: int = 0,
        wait_timeout: float | None = None,
        client_name: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.target = target
        self.lease = lease
        self.request_timeout = request_timeout
        self.min_replicas = min_replicas
        # WAIT must return before the socket timeout fires on it, and leave the script's own
        # round trip room inside the elector's per-request budget.
        self.wait_timeout = request_timeout / 2 if wait_timeout is None else wait_timeout
        self._clock = clock
        self._holder_key, self._term_key, self._channel = lease_keys(lease)
        self._sentinel: Sentinel | None = None
        self._pool: ConnectionPool = self._make_pool(client_name)
        self._client = Redis(connection_pool=self._pool)
        # Registered once; each runs as EVALSHA, loading itself on NOSCRIPT (a restarted
        # server, a new master after failover).
        self._acquire = self._client.register_script(ACQUIRE)
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._read = self._client.register_script(READ)
        self._master_generation = 0  # bumped on every Sentinel +switch-master
        # Bumped whenever the server may have lost writes this process saw (the watch had to
        # reconnect, or the Sentinels switched master). It is part of every version reported,
        # so an observer restarts its count from what the server shows *now*: after a crash
        # with an fsync'd AOF, or a failover, an older record can come back under a version
        # seen before, without the renewals that followed it (rule 2).
        self._epoch = 0
        self._failing: str | None = None  # the problem last logged, until a request succeeds

    # -- connections ----------------------------------------------------------------------

    def _connection_kwargs(self, client_name: str | None) -> dict[str, Any]:
        timeout = self.request_timeout
        return {
            "db": self.target.db,
            "username": self.target.username,
            "password": self.target.password,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "socket_keepalive": True,
            "retry": _ONE_RECONNECT,
            "decode_responses": True,
            "client_name": client_name,
        }

    def _make_pool(self, client_name: str | None) -> ConnectionPool:
        kwargs = self._connection_kwargs(client_name)
        target = self.target
        if target.sentinel:
            sentinel_kwargs = {
                "socket_timeout": self.request_timeout,
                "socket_connect_timeout": self.request_timeout,
                "retry": _ONE_RECONNECT,
                "password": target.sentinel_password,
                "decode_responses": True,
            }
            # redis-py leaves the Sentinel classes untyped.
            self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
                list(target.hosts), sentinel_kwargs=sentinel_kwargs
            )
            assert target.master_name is not None
            return SentinelConnectionPool(  # type: ignore[no-untyped-call]
                target.master_name, self._sentinel, check_connection=False, **kwargs
            )
        host, port = target.hosts[0]
        if target.tls:
            return ConnectionPool(
                connection_class=SSLConnection,
                host=host,
                port=port,
                ssl_ca_certs=target.ca_file,
                ssl_certfile=target.cert_file,
                ssl_keyfile=target.key_file,
                ssl_cert_reqs="required",
                ssl_check_hostname=True,
                **kwargs,
            )
        return ConnectionPool(connection_class=Connection, host=host, port=port, **kwargs)

    @property
    def description(self) -> str:
        return f"{self.target.describe()} lease={self.lease}"

    def _where(self) -> str:
        if isinstance(self._pool, SentinelConnectionPool) and self._pool.master_address:
            host, port = self._pool.master_address
            return f"{self.target.describe()} (master {join_host(str(host), int(port))})"
        return self.target.describe()

    @contextlib.asynccontextmanager
    async def _borrowed(self) -> AsyncIterator[Redis]:
        """One pooled connection for a whole mutation: ``WAIT`` counts the replicas that
        acknowledged the writes *of its own connection*, so it must follow the script on the
        same one. If a Sentinel announced a new master meanwhile, the connection (to the old
        master) is closed instead of going back to the pool."""
        generation = self._master_generation
        client = self._client.client()
        try:
            yield client
        finally:
            connection = client.connection
            if connection is not None and generation != self._master_generation:
                with contextlib.suppress(Exception):
                    await connection.disconnect()
            await client.aclose()

    def _check_same_master(self, generation: int) -> None:
        if generation != self._master_generation:
            raise StoreUnavailable(
                f"redis {self._where()}: the Sentinels switched to a new master during the "
                "request; its outcome does not count"
            )

    # -- errors ---------------------------------------------------------------------------

    async def _guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one request; every failure that is not an answer about the lease becomes
        `StoreUnavailable` with a message that names the cause."""
        try:
            result = await work()
        except StoreError:
            raise
        except Exception as exc:  # redis-py, the socket, TLS, a foreign value in our key
            self._epoch += 1  # the server may have restarted and lost writes
            raise self._unavailable(exc) from exc
        if self._failing is not None:
            log(logger, "info", "redis answers again", store=self._where(), lease=self.lease)
            self._failing = None
        return result

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        level, cause = explain(
            exc, self.target, request_timeout=self.request_timeout, holder_key=self._holder_key
        )
        return self._fail(level, cause)

    def _fail(self, level: str, cause: str, kind: str | None = None) -> StoreUnavailable:
        """The exception to raise; logged once per distinct problem (``kind``, else the
        message), not once per request, until a request succeeds again."""
        message = f"redis {self._where()}: {cause}"
        if (kind or message) != self._failing:
            log(logger, level, "redis unavailable", store=self._where(), error=cause)
            self._failing = kind or message
        return StoreUnavailable(message)

    # -- the contract ---------------------------------------------------------------------

    def _args_keys(self) -> list[str]:
        return [self._holder_key, self._term_key]

    def _tagged(self, record: LeaseRecord | None) -> LeaseRecord | None:
        """The record with this process's epoch in its version (see ``_epoch``)."""
        if record is None:
            return None
        return dataclasses.replace(record, version=f"{record.version}{_EPOCH}{self._epoch}")

    def _reply(self, reply: list[Any]) -> LeaseRecord | None:
        return self._tagged(reply_record(reply))

    async def read(self) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            return self._reply(await self._read(keys=self._args_keys(), client=self._client))

        return await self._guarded(work)

    def _gc_ms(self, duration: float) -> int:
        return _ms(max(self.GC_MIN, self.GC_LEASES * duration))

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        wall = self._clock.wall().isoformat()
        stored = expected
        if expected is not None:
            stored, _, epoch = expected.rpartition(_EPOCH)
            if epoch != str(self._epoch):
                # Observed before the server may have lost writes: not a basis for a grant.
                current = await self.read()
                raise LeaseHeld("the lease was observed before the server restarted", current)

        async def work() -> LeaseRecord:
            async with self._borrowed() as conn:
                generation = self._master_generation
                args: list[str | int] = [
                    identity, _ms(duration), min_term, wall, self._channel,
                    "" if stored is None else stored, _new_version(),
                    self._gc_ms(duration),
                ]  # fmt: skip
                reply = await self._acquire(keys=self._args_keys(), args=args, client=conn)
                record = self._reply(reply)
                if not granted(reply):
                    raise LeaseHeld(f"the lease is not at version {expected}", record)
                assert record is not None
                self._check_same_master(generation)
                if self.min_replicas:
                    await self._confirm_durable(conn, "acquire", record, identity)
                return record

        return await self._guarded(work)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        wall = self._clock.wall().isoformat()

        async def work() -> LeaseRecord:
            async with self._borrowed() as conn:
                generation = self._master_generation
                args: list[str | int] = [
                    identity, term, _ms(duration), wall, self._channel, _new_version(),
                    self._gc_ms(duration),
                ]  # fmt: skip
                reply = await self._renew(keys=self._args_keys(), args=args, client=conn)
                record = self._reply(reply)
                if not granted(reply):
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                assert record is not None
                self._check_same_master(generation)
                if self.min_replicas:
                    await self._confirm_durable(conn, "renew", record, None)
                return record

        return await self._guarded(work)

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            return await self._release_as(self._client, identity, term, publish=True)

        return await self._guarded(work)

    async def _release_as(
        self, client: Redis, identity: str, term: int, *, publish: bool
    ) -> LeaseRecord | None:
        args: list[str | int] = [
            identity, term, self._channel, "1" if publish else "0", _new_version(),
            # The release does not know the lease; keep its value as long as the longest GC
            # (20 minutes): until it goes, a starting replica may take the lease at once.
            self._gc_ms(self.GC_MIN),
        ]  # fmt: skip
        reply = await self._release(keys=self._args_keys(), args=args, client=client)
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
        acked = int(await conn.wait(self.min_replicas, max(1, _ms(self.wait_timeout))))
        if acked >= self.min_replicas:
            return
        undone = ""
        if release_as is not None:
            try:
                await self._release_as(conn, release_as, record.term, publish=False)
                undone = "; the grant was withdrawn"
            except (RedisError, NotOwned):
                undone = "; the followers will see it expire"
        raise self._fail(
            "warning",
            f"only {acked} of {self.min_replicas} replica(s) acknowledged the {op} of term "
            f"{record.term} within {self.wait_timeout:g}s (--redis-min-replicas); it does not "
            f"count{undone}",
            kind="too few replicas acknowledged",
        )

    # -- the watch ------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """Subscribe to the lease's channel and yield every published grant and release. On
        every (re)subscription, read and yield the current record too, so a message missed
        while disconnected cannot leave a follower waiting for a lease that is already free.
        With Sentinel, also follow ``+switch-master`` so both the watch and the requests move
        to a new master within moments, instead of when the old one finally refuses."""
        sentinels = None
        if self._sentinel is not None:
            following = follow_sentinels(
                self._sentinel,
                self.target.master_name,
                self._on_master_switch,
                request_timeout=self.request_timeout,
                backoff=self.WATCH_BACKOFF,
            )
            sentinels = asyncio.create_task(following, name="redis-sentinels")
        delay = self.WATCH_BACKOFF[0]
        poll = self.SWITCH_POLL if sentinels is not None else 1.0
        try:
            while True:
                pubsub: PubSub = self._client.pubsub()
                try:
                    generation = self._master_generation
                    await asyncio.wait_for(self._subscribe(pubsub), self.request_timeout)
                    record = await asyncio.wait_for(self.read(), self.request_timeout)
                    yield record
                    delay = self.WATCH_BACKOFF[0]
                    while generation == self._master_generation:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=poll
                        )
                        if message is not None and message.get("type") == "message":
                            yield self._tagged(value_record(message["data"]))
                except Exception as exc:  # never raise: the elector relies on the watch
                    self._epoch += 1  # the server may have restarted and lost writes
                    if not isinstance(exc, StoreError):
                        self._unavailable(exc)  # logs once per distinct problem
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                    delay = min(delay * 2, self.WATCH_BACKOFF[1])
                finally:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]
        finally:
            if sentinels is not None:
                sentinels.cancel()
                await asyncio.gather(sentinels, return_exceptions=True)

    async def _subscribe(self, pubsub: PubSub) -> None:
        """Subscribe and wait for the server's confirmation: only then does the read that
        follows see a state no later publish can be missed after."""
        await pubsub.subscribe(self._channel)
        while True:
            message = await pubsub.get_message(timeout=self.request_timeout)
            if message is not None and message.get("type") == "subscribe":
                return

    async def _on_master_switch(self, announcement: str) -> None:
        self._master_generation += 1
        self._epoch += 1
        # The new master may lack the latest grant or renewal (asynchronous replication). The
        # watch resubscribes there and reports what it holds: an older record is a new version
        # (waited out a full lease), a lower term or nothing is a loss (waited out too), and
        # the holder's next renewal puts its grant back.
        log(
            logger,
            "warning",
            "redis sentinel switched master",
            announcement=announcement,
            lease=self.lease,
        )
        assert isinstance(self._pool, SentinelConnectionPool)
        # Every connection to the old master is closed now, those in use included: a request
        # in flight there fails (a mutation would not count anyway, see `_borrowed`) and is
        # retried by the elector; new connections ask the Sentinels where the master is.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self._pool.get_master_address(),  # type: ignore[no-untyped-call]
                self.request_timeout,
            )
        with contextlib.suppress(Exception):
            await self._pool.disconnect(inuse_connections=True)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.aclose()
        with contextlib.suppress(Exception):
            await self._pool.aclose()
        if self._sentinel is not None:
            with contextlib.suppress(Exception):
                await self._sentinel.aclose()

    # -- helpers for operators and tests --------------------------------------------------

    async def delete_everything(self) -> None:
        """Drop the lease's keys, term counter included (a reset store)."""
        await self._guarded(lambda: self._client.delete(self._holder_key, self._term_key))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


_EPOCH = "~"  # separates a stored version from the epoch it was seen in


def _new_version() -> str:
    """A version no write ever had: 64 random bits."""
    return secrets.token_hex(8)
