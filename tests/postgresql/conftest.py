"""A database of its own per test, on the session's PostgreSQL server; clients closed after."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from sidecar.backends.postgresql import PostgresStoreClient, parse_target
from tests.postgresql.servers import PostgresServer, database_url

ClientFactory = Callable[..., PostgresStoreClient]


class Database:
    def __init__(self, server: PostgresServer, url: str) -> None:
        self.server = server
        self.url = url
        self.name = url.rsplit("/", 1)[1]

    def sql(self, statement: str) -> str:
        """Run ``statement`` as the superuser; its output (unaligned)."""
        return self.server.psql(statement, self.name).stdout.strip()

    def url_as(self, user: str, password: str | None, **query: str) -> str:
        return self.server.url(self.name, user=user, password=password, **query)


@pytest.fixture
def database() -> Iterator[Database]:
    with database_url() as (server, url):
        yield Database(server, url)


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """``make_client(url, request_timeout=2.0, **options)``; closed after the test."""
    clients: list[PostgresStoreClient] = []

    def make(url: str, request_timeout: float = 2.0, **options: object) -> PostgresStoreClient:
        client = PostgresStoreClient(
            parse_target(url),
            request_timeout=request_timeout,
            **options,  # type: ignore[arg-type]
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
