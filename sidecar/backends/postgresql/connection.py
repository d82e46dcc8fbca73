"""One PostgreSQL connection pool for every lease of a sidecar: the pool, the LISTEN hub, the
epoch, the schema, and how failures are reported. `PostgresLease` objects (from `lease`) and
`PostgresCandidates` (from `candidates`) only hold their names and borrow all of this; the
`client.PostgresStoreClient` built on it makes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from sidecar.backends.base import (
    LeaseRecord,
    StoreUnavailable,
)
from sidecar.backends.kit import versions
from sidecar.backends.kit.guard import Guard
from sidecar.backends.postgresql import schema
from sidecar.backends.postgresql.errors import explain, session_may_be_lost
from sidecar.backends.postgresql.hosts import addresses, first_usable
from sidecar.backends.postgresql.hub import ListenHub
from sidecar.backends.postgresql.target import PostgresTarget
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.supervisor import Supervisor

T = TypeVar("T")
logger = logging.getLogger("sidecar.postgresql")


class SchemaMissing(StoreUnavailable):
    """The schema is not there and this role may not create it (or lacks a privilege)."""


class PostgresConnection:
    """Every lease and candidate group of one sidecar in one PostgreSQL database: one pool (at
    most `max_connections` statements at a time), one LISTEN connection for every watched
    lease and followed group, one epoch."""

    # Reconnections of the LISTEN connection back off within these bounds (jittered).
    WATCH_BACKOFF = (0.05, 2.0)
    # Statements in flight at once, and so the pool's size: a thousand leases renewing at the
    # same moment queue for these instead of opening a thousand connections.
    MAX_CONNECTIONS = 4
    # How long opening a connection may take (TCP, TLS, SCRAM, several hosts in turn). Not
    # bounded by one request's timeout: a connection a request gave up waiting for goes on
    # opening and serves the next request, instead of being abandoned and started again by
    # every request (on a busy host none would ever finish, and the server pays for each).
    CONNECT_TIMEOUT = 10.0

    def __init__(
        self,
        target: PostgresTarget,
        *,
        request_timeout: float = 2.0,
        application_name: str = "leader-sidecar",
        clock: Clock = SYSTEM_CLOCK,
        max_connections: int | None = None,
        create_schema: bool = True,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.target = target
        self.supervisor = supervisor or Supervisor()
        self.request_timeout = request_timeout
        self.application_name = application_name
        self.clock = clock
        self.max_connections = max_connections or self.MAX_CONNECTIONS
        self.create_schema = create_schema
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self._schema_ready = False
        self._schema_task: asyncio.Future[None] | None = None
        self._background: set[asyncio.Future[None]] = set()  # connections going back to the pool
        # Bumped whenever the server may have lost writes this process saw: a request failed,
        # or the LISTEN connection had to reconnect (a failover to a standby that missed
        # writes, a restore from a backup, a restart). It is part of every version reported,
        # so an observer restarts its count from what the server shows *now*: an older row
        # can come back under a version seen before, without the renewals that followed it
        # (rule 2). One server, one epoch: what one lease's failure says holds for all.
        self.epoch = 0
        self.requests = 0  # requests sent through the pool (for tests: one per batch)
        self.guard = Guard("postgresql", logger, lambda: self.description)
        self.hub = ListenHub(self)

    @property
    def description(self) -> str:
        return self.target.describe()

    # -- connections ----------------------------------------------------------------------

    def connect_options(self) -> dict[str, Any]:
        """asyncpg's options for every connection: the URL (credentials, TLS, hosts), a
        primary, a connect timeout, and a server-side statement timeout a little below the
        request timeout, so a statement stuck behind a lock (a long app transaction holding a
        grant back, a locked table) is ended by the server, not left to commit late."""
        settings = {
            "statement_timeout": str(max(1, int(800 * self.request_timeout))),
            "lock_timeout": "0",
            "idle_in_transaction_session_timeout": str(max(1000, int(4000 * self.request_timeout))),
        }
        if "application_name" not in dict(self.target.params):
            settings["application_name"] = self.application_name[:63]
        return {
            "dsn": self.target.url,
            "timeout": max(self.CONNECT_TIMEOUT, self.request_timeout),
            "server_settings": settings,
            "target_session_attrs": self.target.target_session_attrs,
        }

    async def connect(self) -> asyncpg.Connection:
        """A connection of its own (the LISTEN connection, the schema command)."""
        options = self.connect_options()
        connection: asyncpg.Connection = await self._connect(options.pop("dsn"), **options)
        return connection

    async def _connect(self, dsn: str, **options: Any) -> asyncpg.Connection:
        """One connection, the URL's hosts raced (`hosts.first_usable`): each host has a third
        of the request timeout to itself before the next is asked beside it, so that one
        request can still reach the second host (a handshake on a network that works takes
        milliseconds)."""
        hosts = addresses(self.target)
        if len(hosts) < 2:
            connection: asyncpg.Connection = await asyncpg.connect(dsn, **options)
            return connection
        async with asyncio.timeout(options.pop("timeout")):
            return await first_usable(
                lambda host: asyncpg.connect(
                    dsn, host=host[0], port=host[1], timeout=self.CONNECT_TIMEOUT, **options
                ),
                hosts,
                stagger=self.request_timeout / 3,
                close=lambda connection: connection.terminate(),
            )

    async def _get_pool(self) -> asyncpg.Pool:
        async with self._opening:
            if self._pool is None:
                # min_size=0: creating the pool opens nothing, so it cannot fail; connections
                # open on demand and close after a minute idle.
                self._pool = await asyncpg.create_pool(
                    min_size=0,
                    max_size=self.max_connections,
                    max_inactive_connection_lifetime=60.0,
                    reset=_no_reset,
                    connect=self._connect,
                    **self.connect_options(),
                )
            return self._pool

    @contextlib.asynccontextmanager
    async def borrowed(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for one request. A connection whose request failed or was
        cancelled is closed, not pooled: its state is unknown (a statement the server may
        still run, a socket that went quiet)."""
        pool = await self._get_pool()
        acquiring = asyncio.ensure_future(pool.acquire(timeout=self.CONNECT_TIMEOUT))
        try:
            connection = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            # The request gave up (its timeout): the connection goes on opening and back to
            # the pool once it is there.
            acquiring.add_done_callback(lambda done: self._give_back(pool, done))
            raise
        try:
            yield connection
        except (asyncio.CancelledError, TimeoutError):
            # Given up mid-statement: asyncpg cancels it at the server, and the session goes
            # back to the pool once that is done, in the background (closed if it does not
            # finish in time). Reconnecting after every slow request would cost a handshake
            # each time, on a server that is slow already.
            self._release_later(pool, connection)
            if len(addresses(self.target)) > 1:
                # But where the URL names other hosts, the silence may be a primary that hangs
                # while another took over: the pool's other connections, to the same host,
                # would each spend a request finding that out. They reconnect instead, racing
                # every host.
                await pool.expire_connections()
            raise
        except BaseException:
            connection.terminate()  # its state is unknown: a broken socket, a protocol error
            await pool.release(connection)
            raise
        else:
            await pool.release(connection, timeout=self.request_timeout)

    def _give_back(self, pool: asyncpg.Pool, acquired: asyncio.Future[asyncpg.Connection]) -> None:
        if acquired.cancelled() or acquired.exception() is not None:
            return
        self._release_later(pool, acquired.result())

    def _release_later(self, pool: asyncpg.Pool, connection: asyncpg.Connection) -> None:
        """Back to the pool in the background, bounded by the connect timeout (asyncpg closes
        a connection whose release fails or times out)."""

        async def release() -> None:
            with contextlib.suppress(Exception):
                await pool.release(connection, timeout=self.CONNECT_TIMEOUT)

        releasing = asyncio.ensure_future(release())
        self._background.add(releasing)
        releasing.add_done_callback(self._background.discard)

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """One request, bounded by the request timeout: the schema checked (once), a pooled
        connection, ``work`` on it. Failures become `StoreUnavailable` (see `guarded`)."""

        async def attempt() -> T:
            async with asyncio.timeout(self.request_timeout):
                if not self._schema_ready:
                    await self.ensure_schema()
                async with self.borrowed() as connection:
                    self.requests += 1
                    return await work(connection)

        return await self.guarded(attempt)

    # -- the schema -----------------------------------------------------------------------

    async def ensure_schema(self) -> None:
        """Check (once per client) that the schema is there; create it if it is not and the
        role may (see `ensure_schema`). One check at a time per client, shielded from the
        request that waits for it: creating the schema may take longer than a request (a
        busy server, another sidecar creating it), and a creation cut short by every request's
        timeout would never finish."""
        if self._schema_ready:
            return
        if self._schema_task is None or self._schema_task.done():
            self._schema_task = asyncio.ensure_future(self._set_up())
            # Its failure is raised to whoever waits; retrieved here too, for when none does.
            self._schema_task.add_done_callback(lambda t: t.cancelled() or t.exception())
        task = self._schema_task
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._schema_task = None  # the next request tries again

    async def _set_up(self) -> None:
        async with asyncio.timeout(self.CONNECT_TIMEOUT):
            pool = await self._get_pool()
            async with pool.acquire() as connection:
                await ensure_schema(connection, create=self.create_schema)
        self._schema_ready = True

    # -- versions -------------------------------------------------------------------------

    def tag(self) -> str:
        """What this client appends to every version it reports (see ``epoch``)."""
        return versions.epoch_tag(self.epoch)

    def tagged(self, record: LeaseRecord | None) -> LeaseRecord | None:
        return versions.tagged(record, self.epoch)

    def untagged(self, version: str) -> str | None:
        """The stored version a reported one names, or None if it was reported in an earlier
        epoch (see `versions.untagged`)."""
        return versions.untagged(version, self.epoch)

    def new_epoch(self) -> None:
        self.epoch += 1

    # -- errors ---------------------------------------------------------------------------

    async def guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one request; every failure that is not an answer about the lease becomes
        `StoreUnavailable` with a message that names the cause."""
        try:
            result = await self.guard.run(work, self._failed)
        except StoreUnavailable as exc:
            # One the work raised itself (the schema missing) is logged too, once.
            self.guard.report("error", str(exc), str(exc))
            raise
        self.guard.answered()
        return result

    def _failed(self, exc: Exception) -> StoreUnavailable:
        """A request failed without an answer (asyncpg, the socket, TLS, a row that is not
        ours). If its session was lost, the server may have restarted, failed over or been
        restored meanwhile: a new epoch, once per outage (`Guard.outage_begins`), so a
        thousand leases failing one after another do not keep restarting every follower's
        count. A request that only took too long loses nothing: its session lives on (and a
        session cannot outlive a restart, a failover or a restore; the LISTEN session, which
        every watching sidecar holds, sees those as a broken connection too)."""
        if session_may_be_lost(exc) and self.guard.outage_begins():
            self.new_epoch()
        return self.unavailable(exc)

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        level, cause = explain(exc, request_timeout=self.request_timeout, tls=self.target.tls)
        return self.fail(level, cause)

    def fail(self, level: str, cause: str) -> StoreUnavailable:
        """The exception to raise; logged once per distinct problem, not once per request or
        per lease, until a request succeeds again."""
        message = f"postgresql {self.description}: {cause}"
        self.guard.report(level, message, cause)
        return StoreUnavailable(message)

    async def close(self) -> None:
        await self.hub.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.terminate()


async def _no_reset(connection: asyncpg.Connection) -> None:
    """The pool's reset between requests: none. The sidecar never changes session state (no
    SET, no LISTEN, no advisory lock on pooled connections), and asyncpg's default reset is a
    round trip per request."""


async def ensure_schema(connection: asyncpg.Connection, *, create: bool) -> None:
    """Check that the schema is complete and that this role has its privileges; create (or
    complete) it first when it is not and ``create`` is set. Raises `SchemaMissing` with what a
    DBA must do when the role may not."""
    complete, missing = await _inspect(connection)
    if not complete:
        if not create:
            raise SchemaMissing(_missing_message("is missing"))
        try:
            await create_schema(connection)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise SchemaMissing(
                _missing_message(f"is missing and this role may not create it ({exc})")
            ) from None
        complete, missing = await _inspect(connection)
    if missing:
        raise SchemaMissing(
            f"the role {await connection.fetchval('SELECT current_user')} lacks "
            f"{', '.join(missing)} in the {schema.SCHEMA} schema; a DBA runs "
            "`leader-sidecar postgresql-schema --store URL --grant ROLE` "
            "(docs/postgresql.md#least-privileges)"
        )


async def _inspect(connection: asyncpg.Connection) -> tuple[bool, list[str]]:
    row = await connection.fetchrow(schema.INSPECT)
    return bool(row["complete"]), [str(m) for m in row["missing"] or ()]


def _missing_message(what: str) -> str:
    return (
        f"the {schema.SCHEMA} schema {what}; a role that may create it runs "
        "`leader-sidecar postgresql-schema --store URL --grant ROLE` once "
        "(docs/postgresql.md#least-privileges)"
    )


async def create_schema(connection: asyncpg.Connection) -> None:
    """Create (or complete) every object, under a transaction-scoped advisory lock so that
    sidecars starting together on a new database take turns."""
    async with connection.transaction():
        # DDL and waiting for another creator take longer than a lease statement may.
        await connection.execute("SET LOCAL statement_timeout = '60s'")
        await connection.execute("SELECT pg_advisory_xact_lock($1)", schema.SETUP_LOCK)
        complete, _missing = await _inspect(connection)
        if complete:
            return  # another sidecar made it while we waited
        await connection.execute(schema.DDL)
        await connection.execute(schema.MARK_VERSION)
