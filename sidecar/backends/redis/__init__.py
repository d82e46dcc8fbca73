"""The Redis store: one key per lease, its expiry observed by the followers, never its TTL.

Layout, for lease ``NAME`` (the ``{NAME}`` hash tag puts every key in one cluster slot):

* ``leader-sidecar:{NAME}:holder`` — JSON ``{"holder", "term", "duration_ms", "version",
  "acquired_at", "renewed_at"}``, or ``{"term", "released": true, "version", "successor"?}``
  after a release. Its ``PX`` TTL (20 leases, at least a minute) is garbage collection only:
  followers treat the lease as expired after seeing one version unchanged for a lease on
  their own clock (rule 2), so a step of the Redis host's clock can neither free nor prolong
  a lease.
* ``leader-sidecar:{NAME}:term`` — the fencing counter, no TTL, kept on release (rule 5).
* ``leader-sidecar:{NAME}:events`` — pub/sub channel; every grant, renewal and release
  publishes the new value, so followers see each version at once instead of polling.
* ``leader-sidecar:candidates:{GROUP}`` — a hash of the group's candidates (`candidates`).

Each ownership-dependent step is one Lua script (rule 1), so the condition and the write are
atomic at the server. With ``min_replicas`` a grant or renewal counts only after ``WAIT``
confirms that many replicas have it; otherwise the store answers `StoreUnavailable` (fail
closed). Every Redis or socket error becomes `StoreUnavailable` with a message naming the
cause; every request is bounded by the request timeout, and redis-py retries nothing but one
immediate reconnect (the elector retries, against its deadline).

A `RedisStoreClient` serves every lease of a sidecar: one connection pool (at most
``MAX_CONNECTIONS`` requests at once), one pub/sub connection for all watched leases, one
epoch, one Sentinel follower.

* `description` — the store as the sidecar knows it: its URLs, the ``--redis-*`` options.
* `target` — the ``--store`` URL and the ``--redis-*`` flags, checked at start-up.
* `scripts` — the keys, the Lua scripts, and the records their replies decode to.
* `client` — the shared connections, epoch, Sentinel following and error reporting.
* `hub` — the one pub/sub connection, fanned out to the watches.
* `store` — one lease: the contract's requests, ``WAIT``, the watch.
* `candidates` — the candidate registry of a group.
* `sentinel` — following the Sentinels' ``+switch-master``.
* `errors` — one actionable line for every Redis, socket or TLS error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.backends.lazy import lazy_names

if TYPE_CHECKING:
    from sidecar.backends.description import StoreConfig
    from sidecar.backends.redis.client import RedisLeaseStore, RedisStoreClient
    from sidecar.backends.redis.scripts import candidates_key, lease_keys
    from sidecar.backends.redis.store import RedisLease
    from sidecar.backends.redis.target import RedisTarget, check_tls_files, parse_target
    from sidecar.supervisor import Supervisor

_LAZY = {
    "RedisStoreClient": "sidecar.backends.redis.client",
    "RedisLease": "sidecar.backends.redis.store",
    "RedisLeaseStore": "sidecar.backends.redis.client",
    "candidates_key": "sidecar.backends.redis.scripts",
    "lease_keys": "sidecar.backends.redis.scripts",
    "RedisTarget": "sidecar.backends.redis.target",
    "check_tls_files": "sidecar.backends.redis.target",
    "parse_target": "sidecar.backends.redis.target",
}

__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "RedisLease",
    "RedisLeaseStore",
    "RedisStoreClient",
    "RedisTarget",
    "candidates_key",
    "check_tls_files",
    "lease_keys",
    "open_redis_client",
    "open_redis_store",
    "parse_target",
]


def open_redis_client(
    config: StoreConfig, supervisor: Supervisor | None = None
) -> RedisStoreClient:
    """The client for ``--store redis://…``, ``rediss://…`` or ``redis+sentinel://…``, shared
    by every lease of the sidecar; its pub/sub hub and Sentinel follower run under
    ``supervisor``."""
    from sidecar.backends.redis.client import RedisStoreClient

    return RedisStoreClient(_target(config), **_options(config), supervisor=supervisor)


def open_redis_store(config: StoreConfig) -> RedisLeaseStore:
    """The store of ``--lease`` alone, on a client of its own."""
    from sidecar.backends.redis.client import RedisLeaseStore

    return RedisLeaseStore(_target(config), config.lease, **_options(config))


def _target(config: StoreConfig) -> RedisTarget:
    from sidecar.backends.redis.target import check_tls_files, parse_target, settings_of

    settings = settings_of(config)
    target = parse_target(
        config.store,
        username=settings.username,
        password=settings.password,
        sentinel_password=settings.sentinel_password,
        ca_file=settings.ca_file,
        cert_file=settings.cert_file,
        key_file=settings.key_file,
    )
    check_tls_files(target)
    return target


def _options(config: StoreConfig) -> dict[str, Any]:
    from sidecar.backends.redis.target import settings_of

    return {
        "request_timeout": config.timing.request_timeout,
        "min_replicas": settings_of(config).min_replicas,
        "client_name": f"leader-sidecar:{config.identity}",
    }
