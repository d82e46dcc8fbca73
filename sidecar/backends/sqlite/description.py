"""The SQLite store as the rest of the sidecar knows it (`sidecar.backends.description`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.backends.description import Store, StoreConfig
from sidecar.backends.sqlite import never_works, sqlite_path

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor


def check_url(url: str) -> str:
    """The file's directory must exist and be writable, and the file be a database or not be
    there yet."""
    path = Path(sqlite_path(url))
    if reason := never_works(str(path)):
        raise ValueError(reason)
    if not path.parent.is_dir():
        raise ValueError(
            f"the directory {path.parent} does not exist; create it or pick another path"
        )
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"the directory {path.parent} is not writable by this user")
    return url


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    from sidecar.backends.sqlite.client import SQLiteStoreClient

    return SQLiteStoreClient(
        sqlite_path(config.store),
        busy_timeout=0.8 * config.timing.request_timeout,
        supervisor=supervisor,
        read_only=read_only,
    )


SQLITE = Store(
    name="sqlite",
    schemes=("sqlite",),
    forms="sqlite:///relative/path.db, sqlite:////absolute/path.db",
    shown="sqlite:///PATH",
    example="sqlite:///./leader-sidecar.db",
    check_url=check_url,
    open_client=open_client,
)
