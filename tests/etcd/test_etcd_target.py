"""The ``--store etcd://…`` URL and the ``--etcd-*`` flags: parsed, checked, never echoing a
secret. No server needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.backends import open_client
from sidecar.backends.etcd import EtcdStoreClient, parse_target
from sidecar.backends.etcd.records import candidates_prefix, lease_key, range_end
from sidecar.config import load
from sidecar.config_error import ConfigError


def test_a_url_lists_the_endpoints_in_order_with_the_default_port_and_prefix() -> None:
    target = parse_target("etcd://10.0.0.1:2379,10.0.0.2,[::1]:2380")
    assert target.endpoints == (("10.0.0.1", 2379), ("10.0.0.2", 2379), ("::1", 2380))
    assert target.prefix == "leader-sidecar"
    assert not target.tls
    assert target.base_url(2) == "http://[::1]:2380"


def test_the_path_is_the_key_prefix() -> None:
    target = parse_target("etcds://h:2379/team-a/leases/")
    assert target.prefix == "team-a/leases"
    assert target.tls
    assert target.base_url(0) == "https://h:2379"
    assert lease_key(target.prefix, "jobs") == b"team-a/leases/lease/jobs"


def test_credentials_come_from_the_url_unless_flags_override_them() -> None:
    target = parse_target("etcd://app:s3cret@h:2379")
    assert (target.username, target.password) == ("app", "s3cret")
    flagged = parse_target("etcd://app:s3cret@h:2379", username="ops", password="other")
    assert (flagged.username, flagged.password) == ("ops", "other")


def test_the_description_never_shows_the_password() -> None:
    target = parse_target("etcd://app:s3cret@h1:2379,h2:2379/p")
    assert target.describe() == "etcd://app@h1:2379,h2:2379/p"
    assert "s3cret" not in repr(target)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("etcd://h:99999", "is not HOST or HOST:PORT"),
        ("etcd://h:2379?tls=1", "takes no .query"),
        ("etcd://h:2379/bad prefix", "the path is the key prefix"),
        ("etcd://:pw@h:2379", "needs a user"),
    ],
)
def test_a_malformed_url_is_refused_naming_the_problem(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_target(url)


def test_a_refused_url_does_not_echo_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_target("etcd://app:hunter22@h:2379?x=1")
    assert "hunter22" not in str(refused.value)


def test_tls_files_with_a_plain_url_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--etcd-ca-file.*only applies to an etcds://"):
        parse_target("etcd://h:2379", ca_file=str(tmp_path / "ca.pem"))


def test_a_ca_file_that_is_not_a_certificate_stops_the_sidecar_at_start_up(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    config = load(["--store", "etcds://h:2379", "--etcd-ca-file", str(bad)], environ={})
    with pytest.raises(ConfigError, match=r"--etcd-ca-file.*cannot be loaded"):
        open_client(config)


def test_a_client_certificate_without_its_key_is_refused_by_configuration(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="--etcd-cert-file and --etcd-key-file go together"):
        load(["--store", "etcds://h:2379", "--etcd-cert-file", str(cert)], environ={})


def test_the_store_takes_its_settings_from_the_configuration() -> None:
    config = load(
        ["--store", "etcd://h1:2379,h2:2379/apps", "--etcd-username", "app"],
        environ={"LEADER_SIDECAR_ETCD_PASSWORD": "pw-from-env"},
    )
    client = open_client(config)
    assert isinstance(client, EtcdStoreClient)
    assert client.target.username == "app"
    assert client.target.password == "pw-from-env"
    assert client.request_timeout == config.timing.request_timeout
    assert client.description == "etcd://app@h1:2379,h2:2379/apps"


def test_a_group_prefix_never_reads_another_group() -> None:
    """``jobs/`` ends before ``jobs-2/`` begins: one group's range holds only its own keys."""
    start = candidates_prefix("p", "jobs")
    end = range_end(start)
    assert start <= b"p/candidates/jobs/a_1" < end
    assert not start <= b"p/candidates/jobs-2/a_1" < end
    assert range_end(b"a\xff") == b"b"
