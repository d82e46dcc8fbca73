"""`SQLiteStoreClient`: one connection, one thread and one change poller for every lease and
candidate group a sidecar keeps in one SQLite file."""

from __future__ import annotations

from pathlib import Path

from sidecar.backends.sqlite.candidates import SQLiteCandidates
from sidecar.backends.sqlite.connection import Connection
from sidecar.backends.sqlite.lease import SQLiteLease
from sidecar.backends.sqlite.watch import WatchHub
from sidecar.clock import SYSTEM_CLOCK, Clock


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux; only earlier versions of the sidecar read it
        return "unknown"


class SQLiteStoreClient:
    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval: float = 0.05,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.clock = clock
        self.boot_id = _boot_id()
        self.connection = Connection(path, busy_timeout, clock)
        self.hub = WatchHub(self.connection, watch_interval)

    @property
    def description(self) -> str:
        return f"sqlite:///{self.path}"

    def lease(self, name: str) -> SQLiteLease:
        return SQLiteLease(self, name)

    def candidates(self, group: str) -> SQLiteCandidates:
        return SQLiteCandidates(self, group)

    async def close(self) -> None:
        await self.hub.close()
        await self.connection.close()


class SQLiteLeaseStore(SQLiteLease):
    """One lease with a client of its own: the single-lease form (tests, the chaos suite,
    benchmarks, and one sidecar per lease). Closing it closes its client."""

    def __init__(
        self,
        path: str,
        name: str,
        *,
        busy_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval: float = 0.05,
    ) -> None:
        client = SQLiteStoreClient(
            path, busy_timeout=busy_timeout, clock=clock, watch_interval=watch_interval
        )
        super().__init__(client, name)

    async def close(self) -> None:
        await super().close()
        await self.client.close()
