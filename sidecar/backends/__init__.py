"""Lease stores. `base` is the contract; one module per store. A store's client library is
imported only when that store is chosen, so the embedded path stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.config import Config
    from sidecar.supervisor import Supervisor


def open_client(
    config: Config, supervisor: Supervisor | None = None, *, read_only: bool = False
) -> StoreClient:
    """One connection to the configured store, shared by every lease of this sidecar. The
    tasks the client runs itself (a poller, a pub/sub hub, a shared watch) run under
    ``supervisor`` (see `sidecar.supervisor`). ``read_only``: for a reader that must create
    nothing (``status``); a store that would create its file or schema on first use raises
    `NoStore` instead (the network stores' reads create nothing anyway)."""
    scheme = config.store_scheme
    if scheme == "sqlite":
        from sidecar.backends.sqlite import SQLiteStoreClient, sqlite_path

        busy_timeout = 0.8 * config.timing.request_timeout
        return SQLiteStoreClient(
            sqlite_path(config.store),
            busy_timeout=busy_timeout,
            supervisor=supervisor,
            read_only=read_only,
        )
    if scheme in ("redis", "rediss", "redis+sentinel"):
        from sidecar.backends.redis import open_redis_client

        return open_redis_client(config, supervisor)
    if scheme == "kubernetes":
        from sidecar.backends.kubernetes import open_kubernetes_client

        return open_kubernetes_client(config, supervisor)
    if scheme in ("etcd", "etcds"):
        from sidecar.backends.etcd import open_etcd_client

        return open_etcd_client(config, supervisor)
    if scheme in ("postgresql", "postgres"):
        from sidecar.backends.postgresql import open_postgresql_client

        return open_postgresql_client(config, supervisor)
    raise ValueError(f"unknown store {config.store!r}")  # config validation prevents this
