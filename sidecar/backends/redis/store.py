"""The Redis store: one key per lease, expiring by the server's own TTL.

Layout, for lease ``NAME`` (the ``{NAME}`` hash tag puts every key in one cluster slot):

* ``leader-sidecar:{NAME}:holder`` — JSON ``{"holder", "term", "duration_ms", "version",
  "acquired_at", "renewed_at"}`` with a ``PX`` TTL of one lease. Absent = free: expiry is the
  server's TTL and nothing else (rule 2); a record's ``expires_in`` is the key's ``PTTL``.
* ``leader-sidecar:{NAME}:term`` — the fencing counter, no TTL, kept on release (rule 5).
* ``leader-sidecar:{NAME}:events`` — pub/sub channel; every grant and every release publishes
  the new state, so followers react at once instead of polling.

Each ownership-dependent step is one Lua script (rule 1), so the condition and the write are
atomic at the server. With ``min_replicas`` a grant or renewal counts only after ``WAIT``
confirms that many replicas have it; otherwise the store answers `StoreUnavailable` (fail
closed). Every Redis or socket error becomes `StoreUnavailable` with a message naming the
cause; every request is bounded by the request timeout, and redis-py retries nothing but one
immediate reconnect (the elector retries, against its deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    NoPermissionError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)

from sidecar.backends.base import (
    LeaseHeld,
    LeaseRecord,
    NotOwned,
    StoreBehind,
    StoreError,
    StoreUnavailable,
)
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.config import ConfigError
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.config import Config

T = TypeVar("T")
logger = logging.getLogger("sidecar.redis")

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
KEY_PREFIX = "leader-sidecar"
SWITCH_MASTER = "+switch-master"


# redis-py's default retries hide time from the elector, which retries against its own
# deadline. One immediate retry on a connection error only: it replaces a pooled socket that
# died while idle (a restarted server) without failing the request. Timeouts are not retried.
# Retrying a script is safe: acquire and renew are idempotent for the caller, and a repeated
# release answers NotOwned with the freed record.
_ONE_RECONNECT = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def lease_keys(lease: str) -> tuple[str, str, str]:
    """(holder key, term key, event channel) of a lease."""
    base = f"{KEY_PREFIX}:{{{lease}}}"
    return f"{base}:holder", f"{base}:term", f"{base}:events"


# -- settings ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    """Where the lease lives, parsed from ``--store`` and the ``--redis-*`` flags."""

    scheme: str  # redis | rediss | redis+sentinel
    hosts: tuple[tuple[str, int], ...]  # the server, or the sentinels
    db: int = 0
    master_name: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    @property
    def sentinel(self) -> bool:
        return self.scheme == "redis+sentinel"

    def describe(self) -> str:
        """The URL without credentials, for logs."""
        hosts = ",".join(_join_host(host, port) for host, port in self.hosts)
        user = f"{self.username}@" if self.username else ""
        if self.sentinel:
            return f"{self.scheme}://{user}{hosts}/{self.master_name}/{self.db}"
        return f"{self.scheme}://{user}{hosts}/{self.db}"


def _join_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_target(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    sentinel_password: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> RedisTarget:
    """``redis://[user:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
    ``redis+sentinel://[user:password@]host[:port][,host[:port]…]/master-name[/db]``.
    Flag values override the URL's credentials. Raises `ConfigError` naming the problem."""

    def bad(allowed: str) -> ConfigError:
        return ConfigError("--store", _redact(url), allowed)

    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme
    if scheme not in ("redis", "rediss", "redis+sentinel"):
        raise bad("not a redis://, rediss:// or redis+sentinel:// URL")
    if parsed.query or parsed.fragment:
        raise bad(
            "takes no ?query or #fragment: give TLS and credentials as --redis-* flags or "
            "LEADER_SIDECAR_REDIS_* variables"
        )
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    url_user, _, url_password = userinfo.partition(":")
    default_port = DEFAULT_SENTINEL_PORT if scheme == "redis+sentinel" else DEFAULT_PORT
    hosts = tuple(_split_host(part, default_port, bad) for part in hostlist.split(","))
    if scheme != "redis+sentinel" and len(hosts) != 1:
        raise bad("names one host; several hosts only with redis+sentinel://")
    parts = [urllib.parse.unquote(p) for p in parsed.path.split("/") if p]
    master_name = None
    if scheme == "redis+sentinel":
        if not parts:
            raise bad("needs the master name as its path: redis+sentinel://host:port/mymaster")
        master_name, parts = parts[0], parts[1:]
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise bad("the database must be a number, e.g. redis://host:6379/0")
    tls_flags = {"--redis-ca-file": ca_file, "--redis-cert-file": cert_file}
    if scheme != "rediss":
        for flag, value in tls_flags.items():
            if value:
                raise ConfigError(flag, value, "only applies to a rediss:// (TLS) store")
    if sentinel_password and scheme != "redis+sentinel":
        raise ConfigError(
            "--redis-sentinel-password", "(hidden)", "only applies to a redis+sentinel:// store"
        )
    return RedisTarget(
        scheme=scheme,
        hosts=hosts,
        db=int(parts[0]) if parts else 0,
        master_name=master_name,
        username=username or (urllib.parse.unquote(url_user) or None),
        password=password or (urllib.parse.unquote(url_password) or None),
        sentinel_password=sentinel_password,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _split_host(text: str, default_port: int, bad: Callable[[str], ConfigError]) -> tuple[str, int]:
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    if not host or (port and not (port.isdigit() and 0 < int(port) <= 65535)):
        raise bad(f"{text!r} is not HOST or HOST:PORT")
    return host, int(port) if port else default_port


def _redact(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if "@" not in parsed.netloc:
        return url
    userinfo, _, hosts = parsed.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urllib.parse.urlunsplit(parsed._replace(netloc=f"{user}:***@{hosts}"))


def check_tls_files(target: RedisTarget) -> None:
    """Load the CA and client certificate now, so a wrong file stops the sidecar at start-up
    with the flag's name instead of failing every request later."""
    if not target.tls:
        return
    try:
        context = ssl.create_default_context(cafile=target.ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            "--redis-ca-file", target.ca_file, f"cannot be loaded as PEM CA certificates: {exc}"
        ) from None
    if target.cert_file:
        try:
            context.load_cert_chain(target.cert_file, target.key_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(
                "--redis-cert-file",
                target.cert_file,
                f"cannot be loaded with --redis-key-file={target.key_file} as a PEM "
                f"certificate and its private key: {exc}",
            ) from None


def open_redis_store(config: Config) -> RedisLeaseStore:
    """The store for ``--store redis://…``, ``rediss://…`` or ``redis+sentinel://…``."""
    target = parse_target(
        config.store,
        username=config.redis_username,
        password=config.redis_password,
        sentinel_password=config.redis_sentinel_password,
        ca_file=config.redis_ca_file,
        cert_file=config.redis_cert_file,
        key_file=config.redis_key_file,
    )
    check_tls_files(target)
    return RedisLeaseStore(
        target,
        config.lease,
        request_timeout=config.timing.request_timeout,
        min_replicas=config.redis_min_replicas,
        client_name=f"leader-sidecar:{config.identity}",
    )


# -- the store --------------------------------------------------------------------------------


class RedisLeaseStore:
    # -- the scripts: one per ownership-dependent step (rule 1) --------------------------
    # Every script answers the same shape, so one function turns any reply into a record:
    #   {granted (1|0), holder value (JSON string) | nil, PTTL of the holder key in ms,
    #    term counter | nil}
    # A Lua `false` inside a table reaches the client as nil. Terms are Lua numbers (doubles):
    # exact up to 2^53 grants, and cjson writes them exactly up to 10^14 — at one grant per second,
    # three million years.

    # Acquire.
    # KEYS[1] holder key, KEYS[2] term counter.
    # ARGV[1] identity, ARGV[2] lease in ms, ARGV[3] min_term (the caller's high-water mark),
    # ARGV[4] wall time (for humans), ARGV[5] event channel, ARGV[6] '1' after a reset (grant
    # even if the store is behind), ARGV[7] '1' if the Sentinels switched master within a lease.
    # Grants when the holder key is absent (free, released, or expired by its TTL) or holds the
    # caller's identity; the new term is max(INCR counter, min_term + 1, held term + 1), and the
    # counter is raised to it, so no later grant can reuse a term. Publishes the new value.
    # Refuses without writing when the store is behind: its term below min_term (it lost data:
    # a restart without persistence, a failover to a replica that missed writes) or a master
    # switch just happened — a holder it no longer shows may still be leading.
    # Returns {1, new value, lease ms, term}, {0, current value, PTTL, counter} when held, or
    # {2, current value | nil, PTTL, counter} when behind.
    ACQUIRE = """
local current = redis.call('GET', KEYS[1])
local floor = tonumber(ARGV[3]) + 1
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
if current then
  local held = cjson.decode(current)
  if held.holder ~= ARGV[1] then
    return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
  end
  if held.term + 1 > floor then floor = held.term + 1 end
  if held.term > stored then stored = held.term end
end
if (stored < tonumber(ARGV[3]) or ARGV[7] == '1') and ARGV[6] ~= '1' then
  return {2, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
end
local term = redis.call('INCR', KEYS[2])
if term < floor then
  term = floor
  redis.call('SET', KEYS[2], string.format('%d', term))
end
local value = cjson.encode({holder = ARGV[1], term = term, duration_ms = tonumber(ARGV[2]),
                            version = 1, acquired_at = ARGV[4], renewed_at = ARGV[4]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[5], value)
return {1, value, tonumber(ARGV[2]), string.format('%d', term)}
"""

    # Renew.
    # KEYS[1] holder key, KEYS[2] term counter.
    # ARGV[1] identity, ARGV[2] term, ARGV[3] lease in ms, ARGV[4] wall time.
    # Extends the TTL to one full lease only while the key holds this identity AND this term; an
    # expired key is absent, so a lapsed grant cannot be revived (the caller must acquire anew).
    # Returns {1, new value, lease ms, counter} or {0, current value | nil, PTTL, counter}.
    RENEW = """
local current = redis.call('GET', KEYS[1])
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == tonumber(ARGV[2]) then
    held.duration_ms = tonumber(ARGV[3])
    held.renewed_at = ARGV[4]
    held.version = held.version + 1
    local value = cjson.encode(held)
    redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
    return {1, value, tonumber(ARGV[3]), redis.call('GET', KEYS[2])}
  end
end
return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""

    # Release.
    # KEYS[1] holder key, KEYS[2] term counter.
    # ARGV[1] identity, ARGV[2] term, ARGV[3] event channel, ARGV[4] '1' to publish, '0' not to.
    # Compare-and-delete: deletes the holder key only while it holds this identity AND this term;
    # the term counter stays. Publishes {"term": T, "released": true} so followers try at once.
    # Returns {1, nil, -2, released term} or {0, current value | nil, PTTL, counter}.
    RELEASE = """
local current = redis.call('GET', KEYS[1])
if current then
  local held = cjson.decode(current)
  if held.holder == ARGV[1] and held.term == tonumber(ARGV[2]) then
    redis.call('DEL', KEYS[1])
    if ARGV[4] == '1' then
      redis.call('PUBLISH', ARGV[3], cjson.encode({term = held.term, released = true}))
    end
    return {1, false, -2, string.format('%d', held.term)}
  end
end
return {0, current, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""

    # Read.
    # KEYS[1] holder key, KEYS[2] term counter. No ARGV.
    # Returns {0, value | nil, PTTL, counter}: value and its TTL from one moment.
    # (No `#!lua flags=no-writes` shebang: it needs Redis 7, and the scripts otherwise run on
    # any Redis since 3.0 — managed services still run 6.x. We only ever talk to the primary.)
    READ = """
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"""

    # Backoff of the watch's reconnection attempts.
    WATCH_BACKOFF = (0.05, 2.0)
    # The watch waits for a message at most this long before checking whether a Sentinel
    # announced a new master (then it resubscribes there).
    SWITCH_POLL = 0.1

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
        self._acquire = self._client.register_script(self.ACQUIRE)
        self._renew = self._client.register_script(self.RENEW)
        self._release = self._client.register_script(self.RELEASE)
        self._read = self._client.register_script(self.READ)
        self._master_generation = 0  # bumped on every Sentinel +switch-master
        self._switched_at: float | None = None  # monotonic time of the last switch
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
            return f"{self.target.describe()} (master {_join_host(str(host), int(port))})"
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
            raise self._unavailable(exc) from exc
        if self._failing is not None:
            log(logger, "info", "redis answers again", store=self._where(), lease=self.lease)
            self._failing = None
        return result

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        level, cause = self._explain(exc)
        return self._fail(level, cause)

    def _fail(self, level: str, cause: str, kind: str | None = None) -> StoreUnavailable:
        """The exception to raise; logged once per distinct problem (``kind``, else the
        message), not once per request, until a request succeeds again."""
        message = f"redis {self._where()}: {cause}"
        if (kind or message) != self._failing:
            log(logger, level, "redis unavailable", store=self._where(), error=cause)
            self._failing = kind or message
        return StoreUnavailable(message)

    def _explain(self, exc: BaseException) -> tuple[str, str]:
        """(log level, one-line cause) for an error from redis-py or the socket."""
        text = str(exc) or type(exc).__name__
        chain = _exception_chain(exc)
        verify = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
        if verify is not None or "CERTIFICATE_VERIFY_FAILED" in text:
            reason = verify.verify_message if verify is not None else text
            ca = self.target.ca_file or "the system CA bundle"
            return "error", (
                f"TLS: the server's certificate failed verification ({reason}); check that "
                f"--redis-ca-file ({ca}) holds the CA that signed it and that the certificate "
                "names the host in --store"
            )
        if "CERTIFICATE_REQUIRED" in text.upper().replace(" ", "_"):
            return "error", (
                f"TLS: the server requires a client certificate ({text}); give "
                "--redis-cert-file and --redis-key-file"
            )
        if any(isinstance(e, ssl.SSLError) for e in chain) or "[SSL" in text:
            return "error", f"TLS handshake failed: {text}"
        if "reset by peer" in text:
            if self.target.tls:
                # TLS 1.3 checks the client certificate after the handshake: a refusal may
                # arrive as an alert (above) or as a bare reset.
                return "warning", (
                    f"{text} (the server closed the TLS connection; if it requires client "
                    "certificates, give --redis-cert-file and --redis-key-file)"
                )
            return "warning", f"{text} (if the server only speaks TLS, use rediss://)"
        if isinstance(exc, MasterNotFoundError):
            hint = f"check the master name {self.target.master_name!r} in --store"
            if "uthenticat" in text or "NOAUTH" in text or "WRONGPASS" in text:
                hint = "the Sentinels refused our credentials: check --redis-sentinel-password"
            return "error", f"no Sentinel named a primary ({text}); {hint}"
        if isinstance(exc, RedisTimeoutError | TimeoutError):
            return "warning", f"no answer within {self.request_timeout:g}s ({text})"
        if isinstance(exc, BusyLoadingError):
            return "warning", f"the server is still loading its dataset ({text})"
        if isinstance(exc, ReadOnlyError):
            return "warning", f"the server is a read-only replica, failover in progress? ({text})"
        if isinstance(exc, AuthenticationError | AuthorizationError | NoPermissionError) or (
            text.startswith(("NOAUTH", "WRONGPASS", "NOPERM"))
        ):
            return "error", (
                f"authentication or ACL refused ({text}); check --redis-username and "
                "--redis-password / LEADER_SIDECAR_REDIS_PASSWORD"
            )
        if isinstance(exc, ResponseError) and text.startswith("NOREPLICAS"):
            return "warning", f"too few replicas for the server's min-replicas-to-write ({text})"
        if isinstance(exc, ValueError | KeyError | TypeError) or (
            isinstance(exc, ResponseError) and "user_script" in text  # cjson in our scripts
        ):
            return "error", (
                f"unexpected value in {self._holder_key} ({type(exc).__name__}: {text}); "
                "something else writes to this key"
            )
        return "warning", f"{type(exc).__name__}: {text}"

    # -- records --------------------------------------------------------------------------

    def _record(self, reply: list[Any]) -> LeaseRecord | None:
        _granted, value, pttl, counter = reply
        if value is None:
            if counter is None:
                return None
            term = int(counter)
            return LeaseRecord(holder=None, term=term, duration=0.0, expires_in=0.0,
                               version=f"{term}.free")  # fmt: skip
        data = json.loads(value)
        duration = float(data["duration_ms"]) / 1000
        pttl = int(pttl)
        # -1: the key has no TTL, which only someone else's write can cause; count it as held
        # for one more lease rather than as free.
        expires_in = pttl / 1000 if pttl >= 0 else duration if pttl == -1 else 0.0
        return _value_record(data, expires_in)

    def _granted(self, reply: list[Any]) -> bool:
        return int(reply[0]) == 1

    def _args_keys(self) -> list[str]:
        return [self._holder_key, self._term_key]

    # -- the contract ---------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            return self._record(await self._read(keys=self._args_keys(), client=self._client))

        return await self._guarded(work)

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, after_reset: bool = False
    ) -> LeaseRecord:
        wall = self._clock.wall().isoformat()
        switched = (
            self._switched_at is not None and self._clock.now() - self._switched_at < duration
        )

        async def work() -> LeaseRecord:
            async with self._borrowed() as conn:
                generation = self._master_generation
                args: list[str | int] = [
                    identity, _ms(duration), min_term, wall, self._channel,
                    "1" if after_reset else "0", "1" if switched else "0",
                ]  # fmt: skip
                reply = await self._acquire(keys=self._args_keys(), args=args, client=conn)
                record = self._record(reply)
                if int(reply[0]) == 2:
                    why = (
                        "the Sentinels switched master less than a lease ago"
                        if switched
                        else f"its term is below {min_term}: it lost data"
                    )
                    raise StoreBehind(f"redis {self._where()} is behind: {why}", record)
                if not self._granted(reply):
                    holder = record.holder if record else None
                    raise LeaseHeld(f"held by {holder}", record)
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
                args: list[str | int] = [identity, term, _ms(duration), wall]
                reply = await self._renew(keys=self._args_keys(), args=args, client=conn)
                record = self._record(reply)
                if not self._granted(reply):
                    raise NotOwned(f"not held by {identity} with term {term}", record)
                assert record is not None
                self._check_same_master(generation)
                if self.min_replicas:
                    await self._confirm_durable(conn, "renew", record, None)
                return record

        return await self._guarded(work)

    async def release(self, identity: str, term: int) -> LeaseRecord | None:
        async def work() -> LeaseRecord | None:
            args: list[str | int] = [identity, term, self._channel, "1"]
            reply = await self._release(keys=self._args_keys(), args=args, client=self._client)
            record = self._record(reply)
            if not self._granted(reply):
                raise NotOwned(f"not held by {identity} with term {term}", record)
            return record

        return await self._guarded(work)

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
            args: list[str | int] = [release_as, record.term, self._channel, "0"]
            try:
                await self._release(keys=self._args_keys(), args=args, client=conn)
                undone = "; the grant was withdrawn"
            except RedisError:
                undone = "; the grant will expire by its TTL"
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
            sentinels = asyncio.create_task(self._follow_sentinels(), name="redis-sentinels")
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
                            yield _message_record(message["data"])
                except Exception as exc:  # never raise: the elector relies on the watch
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

    async def _follow_sentinels(self) -> None:
        """Listen to every Sentinel's ``+switch-master`` for our master name."""
        assert self._sentinel is not None
        await asyncio.gather(*(self._follow_sentinel(s) for s in self._sentinel.sentinels))

    async def _follow_sentinel(self, sentinel: Redis) -> None:
        delay = self.WATCH_BACKOFF[0]
        while True:
            pubsub = sentinel.pubsub()
            try:
                await asyncio.wait_for(pubsub.subscribe(SWITCH_MASTER), self.request_timeout)
                delay = self.WATCH_BACKOFF[0]
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    # "<master name> <old ip> <old port> <new ip> <new port>"
                    name, *_rest = str(message["data"]).split()
                    if name == self.target.master_name:
                        await self._on_master_switch(str(message["data"]))
            except Exception as exc:  # keep following; requests still rediscover on errors
                log(logger, "debug", "sentinel subscription lost", error=str(exc))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.WATCH_BACKOFF[1])
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]

    async def _on_master_switch(self, announcement: str) -> None:
        self._master_generation += 1
        # The new master may lack the latest grant or renewal (asynchronous replication):
        # acquiring is refused as "behind" for one lease, so a holder the new master does not
        # show reaches its own deadline first.
        self._switched_at = self._clock.now()
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


def _value_record(data: dict[str, Any], expires_in: float) -> LeaseRecord:
    term = int(data["term"])
    return LeaseRecord(
        holder=str(data["holder"]),
        term=term,
        duration=float(data["duration_ms"]) / 1000,
        expires_in=expires_in,
        version=f"{term}.{int(data['version'])}",
        acquired_at=_wall(data.get("acquired_at")),
        renewed_at=_wall(data.get("renewed_at")),
    )


def _message_record(payload: str) -> LeaseRecord:
    """A published grant (the new value: it expires one lease from now) or release."""
    data = json.loads(payload)
    if data.get("released"):
        term = int(data["term"])
        return LeaseRecord(holder=None, term=term, duration=0.0, expires_in=0.0,
                           version=f"{term}.free")  # fmt: skip
    return _value_record(data, float(data["duration_ms"]) / 1000)


def _wall(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _exception_chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
