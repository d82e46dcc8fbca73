"""Registers the PostgreSQL store with the contract suite: a database of its own per harness,
on the session's one server (`tests.postgresql.servers.shared_server`)."""

from __future__ import annotations

import asyncio
import contextlib

from sidecar.backends.postgresql import PostgresLease, PostgresStoreClient, parse_target
from tests.contract.harness import HarnessIterator
from tests.postgresql.servers import database_url


class PostgresHarness:
    lease_name = "contract"

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: list[PostgresStoreClient] = []

    def new_store(self) -> PostgresLease:
        """A replica with one lease: the lease on a client of its own, as the sidecar has."""
        return self.new_client().lease(self.lease_name)

    def new_client(self) -> PostgresStoreClient:
        client = PostgresStoreClient(parse_target(self.url), request_timeout=5.0)
        self.clients.append(client)
        return client

    async def reset(self) -> None:
        await self.new_client().lease(self.lease_name).delete_everything()


@contextlib.asynccontextmanager
async def postgresql_harness() -> HarnessIterator:
    with database_url() as (_server, url):
        harness = PostgresHarness(url)
        try:
            yield harness
        finally:
            await asyncio.gather(*(client.close() for client in harness.clients))


HARNESS = postgresql_harness
