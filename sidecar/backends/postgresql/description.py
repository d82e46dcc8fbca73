"""The PostgreSQL store as the rest of the sidecar knows it (`sidecar.backends.description`):
the ``--store`` URL (everything else is in it, as for libpq), the driver it needs, and its
``postgresql-schema`` command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.description import Command, Store, StoreConfig
from sidecar.backends.postgresql.names import EXTRA, INSTALL, SCHEMES
from sidecar.config_error import ConfigError

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor


def check_url(url: str) -> str:
    """The URL as libpq would take it, its TLS files loaded, and the driver installed."""
    from sidecar.backends.postgresql.target import driver_absent, parse_target

    try:
        parse_target(url)
    except ConfigError as exc:
        raise ValueError(exc.allowed) from None
    if reason := driver_absent():
        raise ValueError(reason)
    return url


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    """Imports the driver first: one found but broken stops the sidecar with the line a
    missing one does (`check_url`), not a traceback."""
    from sidecar.backends.postgresql.target import missing_driver

    if reason := missing_driver():
        raise ConfigError("--store", config.store, reason)
    from sidecar.backends.postgresql import open_postgresql_client

    return open_postgresql_client(config, supervisor)


POSTGRESQL = Store(
    name="postgresql",
    schemes=SCHEMES,
    forms="postgresql://[user@]host[:port][,host[:port]]/dbname[?sslmode=…]",
    shown="postgresql://…",
    example="postgresql://sidecar@127.0.0.1:5432/app",
    check_url=check_url,
    open_client=open_client,
    note=f"postgresql:// needs the [{EXTRA}] extra: {INSTALL}",
    extras=(("--store postgresql://...", INSTALL),),
    commands=(
        Command(
            "postgresql-schema",
            "create the PostgreSQL store's schema and grants",
            "sidecar.backends.postgresql.command:main",
        ),
    ),
)
