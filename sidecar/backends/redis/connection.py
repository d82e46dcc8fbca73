"""One Redis connection for every lease of a sidecar: the pool, the pub/sub hub, the epoch,
the Sentinels, and how failures are reported. `RedisLease` objects (from `store`) and
`RedisCandidates` (from `candidates`) only hold their keys and borrow all of this; the
`client.RedisStoreClient` built on it makes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from sidecar.backends.base import (
    LeaseRecord,
    StoreError,
    StoreUnavailable,
)
from sidecar.backends.kit import versions
from sidecar.backends.kit.guard import Guard
from sidecar.backends.redis.errors import explain, is_foreign_value
from sidecar.backends.redis.hub import ChannelHub
from sidecar.backends.redis.reads import WatchReads
from sidecar.backends.redis.scripts import (
    ACQUIRE,
    BEAT,
    BEAT_AND_LIST,
    HAND_OVER,
    LEAVE,
    MARK_LOST,
    READ,
    READ_MANY,
    RELEASE,
    RENEW,
    RENEW_MANY,
    lease_keys,
    reply_record,
)
from sidecar.backends.redis.sentinel import follow_sentinels
from sidecar.backends.redis.target import RedisTarget, join_host
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.logs import log
from sidecar.supervisor import Supervisor

T = TypeVar("T")
logger = logging.getLogger("sidecar.redis")

# redis-py's default retries hide time from the elector, which retries against its own
# deadline. One immediate retry on a connection error only: it replaces a pooled socket that
# died while idle (a restarted server) without failing the request. Timeouts are not retried.
# Retrying a script is safe: acquire and renew are idempotent for the caller, and a repeated
# release answers NotOwned with the freed record.
_ONE_RECONNECT = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def _driver() -> dict[str, Any]:
    """The version ``CLIENT SETINFO`` names, given rather than looked up: redis-py 8 looks it
    up in the installed packages' metadata for every connection it makes (every distribution on
    ``sys.path`` read, a few milliseconds of CPU: the first one lands between a sidecar's first
    answer and its first grant). An older redis-py, without ``driver_info``, is left as it
    was."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


_DRIVER = _driver()


class RedisConnection:
    """Every lease and candidate group of one sidecar on one Redis (a server, a TLS server, or
    the master a group of Sentinels names): one connection pool, at most `max_connections`
    requests at a time, one pub/sub connection for every watched lease, one epoch."""

    # Backoff of the pub/sub connection's (and the Sentinel subscriptions') reconnections.
    WATCH_BACKOFF = (0.05, 2.0)
    # Requests in flight at once, and so the pool's size: a thousand leases renewing at the
    # same moment queue for these instead of opening a thousand sockets.
    MAX_CONNECTIONS = 16

    def __init__(
        self,
        target: RedisTarget,
        *,
        request_timeout: float = 2.0,
        min_replicas: int = 0,
        wait_timeout: float | None = None,
        client_name: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        max_connections: int | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.target = target
        # Restarts the pub/sub hub and the Sentinel follower if either fails (a bug).
        self.supervisor = supervisor or Supervisor()
        self.request_timeout = request_timeout
        self.min_replicas = min_replicas
        # WAIT must return before the socket timeout fires on it, and leave the script's own
        # round trip room inside the elector's per-request budget.
        self.wait_timeout = request_timeout / 2 if wait_timeout is None else wait_timeout
        self.clock = clock
        self._slots = asyncio.Semaphore(max_connections or self.MAX_CONNECTIONS)
        # The watches' reads (at every (re)subscription), many leases per request, take at
        # most half the connections: the rest stay free for acquires and renewals.
        self.watch_reads = WatchReads(self, max(1, (max_connections or self.MAX_CONNECTIONS) // 2))
        self._sentinel: Sentinel | None = None
        self._pool: ConnectionPool = self._make_pool(client_name)
        self.redis = Redis(connection_pool=self._pool)
        # Registered once for every lease; each runs as EVALSHA, loading itself on NOSCRIPT
        # (a restarted server, a new master after failover).
        self.acquire_script = self.redis.register_script(ACQUIRE)
        self.renew_script = self.redis.register_script(RENEW)
        self.renew_many_script = self.redis.register_script(RENEW_MANY)
        self.release_script = self.redis.register_script(RELEASE)
        self.hand_over_script = self.redis.register_script(HAND_OVER)
        self.read_script = self.redis.register_script(READ)
        self.read_many_script = self.redis.register_script(READ_MANY)
        self.mark_lost_script = self.redis.register_script(MARK_LOST)
        self.beat_script = self.redis.register_script(BEAT)
        self.beat_and_list_script = self.redis.register_script(BEAT_AND_LIST)
        self.leave_script = self.redis.register_script(LEAVE)
        self.master_generation = 0  # bumped on every Sentinel +switch-master
        # Bumped whenever the server may have lost writes this process saw (the pub/sub
        # connection had to reconnect, a request failed, the Sentinels switched master). It is
        # part of every version reported, for every lease, so an observer restarts its count
        # from what the server shows *now*: after a crash with an fsync'd AOF, or a failover,
        # an older record can come back under a version seen before, without the renewals
        # that followed it (rule 2). One server, one epoch: what one lease's failure says
        # about the server holds for all of them.
        self.epoch = 0
        self.guard = Guard("redis", logger, self.where)
        self.hub = ChannelHub(self)
        self._sentinels: asyncio.Task[None] | None = None

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
            # Bytes that are not UTF-8 in our keys (a foreign writer) arrive as lone
            # surrogates for `sidecar.backends.records` to refuse, not as a failed read.
            "encoding_errors": "surrogateescape",
            "client_name": client_name,
            **_DRIVER,
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
                **_DRIVER,
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
        return self.target.describe()

    def where(self) -> str:
        if isinstance(self._pool, SentinelConnectionPool) and self._pool.master_address:
            host, port = self._pool.master_address
            return f"{self.target.describe()} (master {join_host(str(host), int(port))})"
        return self.target.describe()

    @contextlib.asynccontextmanager
    async def borrowed(self) -> AsyncIterator[Redis]:
        """What a request talks through, after one of the client's request slots (waited for
        no longer than a request may take). With ``--redis-min-replicas``, one pooled
        connection for the whole request: ``WAIT`` counts the replicas that acknowledged the
        writes *of its own connection*, so it must follow the script on the same one; if a
        Sentinel announced a new master meanwhile, that connection (to the old master) is
        closed instead of going back to the pool. Without it, the shared client, a pooled
        connection per command: building a client of its own cost more than the request
        itself (0.2 of 0.38 ms), on both store requests of a hand-off."""
        try:
            async with asyncio.timeout(self.request_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"redis {self.where()}: every connection stayed busy for {self.request_timeout:g}s"
            ) from None
        try:
            if not self.min_replicas:
                yield self.redis
                return
            generation = self.master_generation
            client = self.redis.client()
            try:
                yield client
            finally:
                connection = client.connection
                if connection is not None and generation != self.master_generation:
                    with contextlib.suppress(Exception):
                        await connection.disconnect()
                await client.aclose()
        finally:
            self._slots.release()

    def check_same_master(self, generation: int) -> None:
        if generation != self.master_generation:
            raise StoreUnavailable(
                f"redis {self.where()}: the Sentinels switched to a new master during the "
                "request; its outcome does not count"
            )

    # -- versions -------------------------------------------------------------------------

    def tagged(self, record: LeaseRecord | None) -> LeaseRecord | None:
        """The record with this client's epoch in its version (see ``epoch``)."""
        return versions.tagged(record, self.epoch)

    def untagged(self, version: str) -> str | None:
        """The stored version a reported one names, or None if it was reported in an earlier
        epoch (see `versions.untagged`)."""
        return versions.untagged(version, self.epoch)

    # -- errors ---------------------------------------------------------------------------

    async def guarded(self, work: Callable[[], Awaitable[T]], key: str) -> T:
        """Run one request; every failure that is not an answer about the lease becomes
        `StoreUnavailable` with a message that names the cause (``key``: the key a foreign
        value would be in)."""
        result = await self.guard.run(work, lambda exc: self._failed(exc, key))
        self.guard.answered()
        return result

    def _failed(self, exc: Exception, key: str) -> StoreUnavailable:
        """A request failed without an answer (redis-py, the socket, TLS, a foreign value in
        our key). The server may have restarted and lost writes: a new epoch. Once per outage
        (`Guard.outage_begins`), and never for a foreign value in one key: the epoch is every
        lease's, and a thousand leases' requests failing one after another must not keep
        restarting every follower's count (no takeover, ever). The pub/sub hub bumps the epoch
        itself on every reconnection."""
        if not is_foreign_value(exc) and self.guard.outage_begins():
            self.epoch += 1
        return self.unavailable(exc, key)

    def unavailable(self, exc: BaseException, key: str) -> StoreUnavailable:
        level, cause = explain(
            exc, self.target, request_timeout=self.request_timeout, holder_key=key
        )
        return self.fail(level, cause)

    def fail(self, level: str, cause: str, kind: str | None = None) -> StoreUnavailable:
        """The exception to raise; logged once per distinct problem (``kind``, else the
        message), not once per request or per lease, until a request succeeds again."""
        message = f"redis {self.where()}: {cause}"
        self.guard.report(level, kind or message, cause)
        return StoreUnavailable(message)

    # -- Sentinel -------------------------------------------------------------------------

    def follow_sentinels(self) -> None:
        """With Sentinel, follow ``+switch-master`` (once per client, from its first watch
        until `close`), so requests and the pub/sub connection move to a new master within
        moments, instead of when the old one finally refuses."""
        if self._sentinel is None or self._sentinels is not None:
            return
        sentinel = self._sentinel

        def following() -> Awaitable[None]:
            return follow_sentinels(
                sentinel,
                self.target.master_name,
                self._on_master_switch,
                request_timeout=self.request_timeout,
                backoff=self.WATCH_BACKOFF,
            )

        self._sentinels = self.supervisor.spawn("redis-sentinels", following)

    async def _on_master_switch(self, announcement: str) -> None:
        self.master_generation += 1
        self.epoch += 1
        # The new master may lack the latest grant or renewal (asynchronous replication). The
        # hub resubscribes there and every watch reports what it holds: an older record is a
        # new version (waited out a full lease), a lower term or nothing is a loss (waited out
        # too), and the holder's next renewal puts its grant back.
        log(logger, "warning", "redis sentinel switched master", announcement=announcement)
        assert isinstance(self._pool, SentinelConnectionPool)
        # Every connection to the old master is closed now, those in use included: a request
        # in flight there fails (a mutation would not count anyway, see `borrowed`) and is
        # retried by the elector; new connections ask the Sentinels where the master is.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self._pool.get_master_address(),  # type: ignore[no-untyped-call]
                self.request_timeout,
            )
        with contextlib.suppress(Exception):
            await self._pool.disconnect(inuse_connections=True)

    def record_in(self, lease: str, reply: list[Any]) -> LeaseRecord | StoreError | None:
        """One lease's part of a many-lease script's reply (`RENEW_MANY`, `READ_MANY`), tagged;
        or the error its own request would have raised: {-1, error} for keys that hold
        something else, or a value that cannot be decoded."""
        holder_key = lease_keys(lease)[0]
        if int(reply[0]) == -1:
            return self.fail(
                "error",
                f"unexpected value in {holder_key} ({reply[1]}); something else writes to this key",
            )
        try:
            return self.tagged(reply_record(reply))
        except (ValueError, KeyError, TypeError) as exc:
            return self.unavailable(exc, holder_key)

    async def close(self) -> None:
        await self.hub.close()
        await self.watch_reads.close()
        if self._sentinels is not None:
            self._sentinels.cancel()
            await asyncio.gather(self._sentinels, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self._pool.aclose()
        if self._sentinel is not None:
            with contextlib.suppress(Exception):
                await self._sentinel.aclose()


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
