"""The Redis store (see `sidecar.backends.redis.store`)."""

from sidecar.backends.redis.store import (
    RedisLeaseStore,
    RedisTarget,
    check_tls_files,
    lease_keys,
    open_redis_store,
    parse_target,
)

__all__ = [
    "RedisLeaseStore",
    "RedisTarget",
    "check_tls_files",
    "lease_keys",
    "open_redis_store",
    "parse_target",
]
