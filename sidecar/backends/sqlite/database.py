"""`SQLiteDatabase`: what every lease and candidate group of a sidecar shares in one SQLite
file, and borrows: the connection, its thread, the change poller."""

from __future__ import annotations

from pathlib import Path

from sidecar.backends.sqlite.connection import Connection
from sidecar.backends.sqlite.watch import WatchHub
from sidecar.clock import SYSTEM_CLOCK, Clock
from sidecar.supervisor import Supervisor


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux; only earlier versions of the sidecar read it
        return "unknown"


class SQLiteDatabase:
    """One SQLite file as every lease and candidate group of a sidecar shares it: one
    connection and its thread (`connection`), one change poller (`watch`), the host's boot id.
    The leases and groups borrow it; `client.SQLiteStoreClient` makes them."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval: float = 0.05,
        supervisor: Supervisor | None = None,
        read_only: bool = False,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.clock = clock
        self.boot_id = _boot_id()
        self.connection = Connection(path, busy_timeout, clock, read_only=read_only)
        self.hub = WatchHub(self.connection, watch_interval, supervisor or Supervisor())

    @property
    def description(self) -> str:
        return f"sqlite:///{self.path}"

    async def close(self) -> None:
        await self.hub.close()
        await self.connection.close()
