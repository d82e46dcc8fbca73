"""The Redis store: one key per lease, its expiry observed by the followers, never its TTL.

Layout, for lease ``NAME`` (the ``{NAME}`` hash tag puts every key in one cluster slot):

* ``leader-sidecar:{NAME}:holder`` — JSON ``{"holder", "term", "duration_ms", "version",
  "acquired_at", "renewed_at"}``, or ``{"term", "released": true, "version"}`` after a release.
  Its ``PX`` TTL (20 leases, at least a minute) is garbage collection only: followers treat the
  lease as expired after seeing one version unchanged for a lease on their own clock (rule 2),
  so a step of the Redis host's clock can neither free nor prolong a lease.
* ``leader-sidecar:{NAME}:term`` — the fencing counter, no TTL, kept on release (rule 5).
* ``leader-sidecar:{NAME}:events`` — pub/sub channel; every grant, renewal and release
  publishes the new value, so followers see each version at once instead of polling.

Each ownership-dependent step is one Lua script (rule 1), so the condition and the write are
atomic at the server. With ``min_replicas`` a grant or renewal counts only after ``WAIT``
confirms that many replicas have it; otherwise the store answers `StoreUnavailable` (fail
closed). Every Redis or socket error becomes `StoreUnavailable` with a message naming the
cause; every request is bounded by the request timeout, and redis-py retries nothing but one
immediate reconnect (the elector retries, against its deadline).

* `target` — the ``--store`` URL and the ``--redis-*`` flags, checked at start-up.
* `scripts` — the keys, the Lua scripts, and the records their replies decode to.
* `store` — the lease store: connections, the contract's requests, ``WAIT``, the watch.
* `sentinel` — following the Sentinels' ``+switch-master``.
* `errors` — one actionable line for every Redis, socket or TLS error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.redis.scripts import lease_keys
from sidecar.backends.redis.store import RedisLeaseStore
from sidecar.backends.redis.target import RedisTarget, check_tls_files, parse_target

if TYPE_CHECKING:
    from sidecar.config import Config

__all__ = [
    "RedisLeaseStore",
    "RedisTarget",
    "check_tls_files",
    "lease_keys",
    "open_redis_store",
    "parse_target",
]


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
