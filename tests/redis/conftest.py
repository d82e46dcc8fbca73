"""Real Redis servers for the Redis store's tests (see `tests.redis.servers`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from sidecar.backends.redis import RedisLeaseStore, parse_target
from tests.redis.servers import RedisServer, TlsFiles

StoreFactory = Callable[..., RedisLeaseStore]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    started = RedisServer.start(directory)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def make_store() -> AsyncIterator[StoreFactory]:
    """``make_store(url, lease="t", request_timeout=1.0, **target_flags)``; closed after."""
    stores: list[RedisLeaseStore] = []

    def make(
        url: str,
        lease: str = "t",
        *,
        request_timeout: float = 1.0,
        min_replicas: int = 0,
        **flags: str,
    ) -> RedisLeaseStore:
        store = RedisLeaseStore(
            parse_target(url, **flags),
            lease,
            request_timeout=request_timeout,
            min_replicas=min_replicas,
            client_name="leader-sidecar:test",  # as the sidecar names its connections
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles.make(tmp_path_factory.mktemp("tls"), "good")


@pytest.fixture(scope="session")
def other_tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A second, unrelated CA: the wrong one."""
    return TlsFiles.make(tmp_path_factory.mktemp("tls-other"), "other")
