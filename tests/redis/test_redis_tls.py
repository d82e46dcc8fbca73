"""``rediss://`` against a real redis-server with a CA made by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.backends.base import StoreUnavailable
from tests.redis.conftest import StoreFactory
from tests.redis.servers import RedisServer, TlsFiles

pytestmark = pytest.mark.slow


@pytest.fixture
def tls_server(tmp_path: Path, tls_files: TlsFiles) -> Iterator[RedisServer]:
    (tmp_path / "tls").mkdir()
    started = RedisServer.start(tmp_path / "tls", tls=tls_files)
    yield started
    started.stop()


@pytest.fixture
def mtls_server(tmp_path: Path, tls_files: TlsFiles) -> Iterator[RedisServer]:
    """Requires a client certificate signed by the CA."""
    (tmp_path / "mtls").mkdir()
    started = RedisServer.start(tmp_path / "mtls", tls=tls_files, tls_auth_clients=True)
    yield started
    started.stop()


async def test_rediss_with_the_servers_ca_holds_a_lease(
    tls_server: RedisServer, tls_files: TlsFiles, make_store: StoreFactory
) -> None:
    assert tls_server.url.startswith("rediss://")
    store = make_store(tls_server.url, ca_file=str(tls_files.ca_cert))
    granted = await store.try_acquire("a_1", 5.0, 0, expected=None)
    renewed = await store.renew("a_1", granted.term, 5.0)
    assert (renewed.holder, renewed.term) == ("a_1", granted.term)


async def test_a_wrong_ca_is_refused_with_an_error_that_names_the_ca_file(
    tls_server: RedisServer, other_tls_files: TlsFiles, make_store: StoreFactory
) -> None:
    store = make_store(tls_server.url, ca_file=str(other_tls_files.ca_cert))
    with pytest.raises(StoreUnavailable) as refused:
        await store.try_acquire("a_1", 5.0, 0, expected=None)
    message = str(refused.value)
    assert "TLS: the server's certificate failed verification" in message
    assert str(other_tls_files.ca_cert) in message
    assert "--redis-ca-file" in message


async def test_without_a_ca_file_the_system_bundle_does_not_trust_a_private_ca(
    tls_server: RedisServer, make_store: StoreFactory
) -> None:
    store = make_store(tls_server.url)
    with pytest.raises(StoreUnavailable, match="system CA bundle"):
        await store.read()


async def test_plain_redis_against_a_tls_port_is_unavailability(
    tls_server: RedisServer, make_store: StoreFactory
) -> None:
    store = make_store(tls_server.url.replace("rediss://", "redis://"), request_timeout=0.5)
    with pytest.raises(StoreUnavailable):
        await store.read()


async def test_a_server_that_requires_client_certificates_accepts_ours(
    mtls_server: RedisServer, tls_files: TlsFiles, make_store: StoreFactory
) -> None:
    without = make_store(mtls_server.url, ca_file=str(tls_files.ca_cert))
    # TLS 1.3 refuses a missing client certificate after the handshake: an alert or a reset.
    with pytest.raises(StoreUnavailable, match=r"client certificate.*--redis-cert-file"):
        await without.read()
    with_cert = make_store(
        mtls_server.url,
        ca_file=str(tls_files.ca_cert),
        cert_file=str(tls_files.client_cert),
        key_file=str(tls_files.client_key),
    )
    granted = await with_cert.try_acquire("a_1", 5.0, 0, expected=None)
    assert granted.holder == "a_1"
