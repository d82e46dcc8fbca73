"""``zookeepers://``: a real ZooKeeper serving its secure client port only (Netty, PEM files,
client certificates required), two sidecars given the CA and a client certificate through
``--zookeeper-*`` flags and the password through its variable; what a wrong CA or a missing
certificate does."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.target import parse_target
from sidecar.config_error import ConfigError
from tests.redis.servers import TlsFiles
from tests.support.sidecars import observing, sidecars
from tests.zookeeper.servers import Standalone, free_ports, fresh_chroot

pytestmark = pytest.mark.slow
LEASE = 2.0
NETTY = "/usr/share/java/netty-codec.jar"


class SecureStandalone(Standalone):
    """A standalone server whose only client port is the secure one: TLS through Netty, its
    certificate and the CA its clients' certificates must chain to as PEM files."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.tls = TlsFiles.make(directory, "zk")
        self.secure_port = free_ports(1)[0]
        self.keystore = directory / "zk-server.pem"
        self.keystore.write_text(self.tls.server_key.read_text() + self.tls.server_cert.read_text())

    def settings(self) -> dict[str, str]:
        settings = super().settings()
        # The plain port stays for the four-letter words the helpers ask "serving?" with.
        settings.update({
            "secureClientPort": str(self.secure_port),
            "secureClientPortAddress": "127.0.0.1",
            "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
            "ssl.keyStore.location": str(self.keystore),
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": str(self.tls.ca_cert),
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": "need",
        })  # fmt: skip
        return settings

    def command(self) -> list[str]:
        # The package's jar names Netty's transport and handler but not its codec, which the
        # Netty connection factory needs.
        command = super().command()
        index = command.index("-cp") + 1
        command[index] += ":" + NETTY
        return command

    def secure_url(self, chroot: str = "") -> str:
        return f"zookeepers://127.0.0.1:{self.secure_port}{chroot}"


@pytest.fixture(scope="module")
def server() -> Iterator[SecureStandalone]:
    with tempfile.TemporaryDirectory(prefix="zookeeper-tls-") as tmp:
        started = SecureStandalone(Path(tmp))
        started.launch()
        try:
            started.wait_serving()
            yield started
        finally:
            started.kill()


def tls_flags(tls: TlsFiles) -> list[str]:
    return [
        "--zookeeper-ca-file", str(tls.ca_cert),
        "--zookeeper-cert-file", str(tls.client_cert),
        "--zookeeper-key-file", str(tls.client_key),
    ]  # fmt: skip


async def test_two_sidecars_lead_in_turn_over_tls_with_a_digest_user_from_the_environment(
    server: SecureStandalone,
) -> None:
    """The password comes from ``LEADER_SIDECAR_ZOOKEEPER_PASSWORD`` (a Secret in a pod) and
    reaches no log line; exactly one of two leads, and after its SIGTERM the other."""
    password = "zk-tls-password-of-a-test"
    url = server.secure_url(fresh_chroot("tls"))
    with sidecars(
        ["a", "b"],
        url,
        lease_duration=f"{LEASE:g}s",
        args=[*tls_flags(server.tls), "--zookeeper-username", "app"],
        env={"LEADER_SIDECAR_ZOOKEEPER_PASSWORD": password},
    ) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            leader = next(proc for proc in procs if proc.name == first.name)
            leader.terminate()
            second = await observer.wait_for(
                lambda s: s.leader and s.name != first.name, timeout=2 * LEASE
            )
            assert second.term is not None
            assert first.term is not None
            assert second.term > first.term
        observer.assert_never_two_leaders()
    assert not [line for proc in procs for line in proc.raw if password in line]
    assert any("zookeepers://app@" in line for proc in procs for line in proc.raw)


async def test_a_server_whose_certificate_the_ca_did_not_sign_is_never_trusted(
    server: SecureStandalone, tmp_path: Path
) -> None:
    """A client given another CA never gets a session: every request fails as the store
    being unavailable, and nothing is written."""
    other = TlsFiles.make(tmp_path, "other")
    target = parse_target(
        server.secure_url(fresh_chroot("wrong-ca")),
        ca_file=str(other.ca_cert),
        cert_file=str(server.tls.client_cert),
        key_file=str(server.tls.client_key),
    )
    client = ZooKeeperStoreClient(target, request_timeout=1.0)
    try:
        with pytest.raises(StoreUnavailable):
            await client.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
        assert client.session.sessions == 0
    finally:
        await client.close()


async def test_without_a_client_certificate_the_server_refuses_the_session(
    server: SecureStandalone,
) -> None:
    target = parse_target(
        server.secure_url(fresh_chroot("no-cert")), ca_file=str(server.tls.ca_cert)
    )
    client = ZooKeeperStoreClient(target, request_timeout=1.0)
    try:
        with pytest.raises(StoreUnavailable):
            await client.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
        assert client.session.sessions == 0
    finally:
        await client.close()


async def test_with_the_ca_and_a_client_certificate_a_grant_is_read_back(
    server: SecureStandalone,
) -> None:
    url = server.secure_url(fresh_chroot("grant"))
    flags = {
        "ca_file": str(server.tls.ca_cert),
        "cert_file": str(server.tls.client_cert),
        "key_file": str(server.tls.client_key),
    }
    writer = ZooKeeperStoreClient(parse_target(url, **flags), request_timeout=5.0)
    reader = ZooKeeperStoreClient(parse_target(url, **flags), request_timeout=5.0)
    try:
        granted = await writer.lease("l").try_acquire("a_1", LEASE, 0, expected=None)
        seen = await reader.lease("l").read()
        assert seen is not None
        assert (seen.holder, seen.term) == (granted.holder, granted.term) == ("a_1", 1)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.gather(writer.close(), reader.close())


def test_tls_files_on_a_plain_url_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_target("zookeeper://127.0.0.1:2181", ca_file="/etc/ssl/ca.pem")
    assert str(refused.value).startswith("--zookeeper-ca-file=/etc/ssl/ca.pem: ")
    assert "zookeepers://" in refused.value.allowed


def test_a_password_without_a_user_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_target("zookeeper://127.0.0.1:2181", password="s3cret")
    assert str(refused.value).startswith("--zookeeper-password=(hidden): needs a user")
    assert "s3cret" not in str(refused.value)


def test_flags_override_the_urls_credentials() -> None:
    target = parse_target(
        "zookeepers://old:old-pw@127.0.0.1:2281/leases", username="app", password="new-pw"
    )
    assert (target.username, target.password, target.tls) == ("app", "new-pw", True)
    assert target.digest == b"app:new-pw"
    assert target.describe() == "zookeepers://app@127.0.0.1:2281/leases"
