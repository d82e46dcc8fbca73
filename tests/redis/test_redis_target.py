"""Parsing ``--store`` for Redis and the start-up checks: no server needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from redis.crc import key_slot

from sidecar.backends.redis import lease_keys, open_redis_store, parse_target
from sidecar.config import load
from sidecar.config_error import ConfigError

ENV: dict[str, str] = {}


def test_a_plain_url_names_host_port_and_database() -> None:
    target = parse_target("redis://redis.example:6380/3")
    assert (target.scheme, target.hosts, target.db) == ("redis", (("redis.example", 6380),), 3)
    assert not target.tls
    assert not target.sentinel


def test_port_and_database_default_to_6379_and_0() -> None:
    target = parse_target("redis://redis.example")
    assert (target.hosts, target.db) == ((("redis.example", 6379),), 0)


def test_credentials_come_from_the_url_unless_flags_override_them() -> None:
    from_url = parse_target("redis://app:s%40cret@h:1/0")
    assert (from_url.username, from_url.password) == ("app", "s@cret")
    overridden = parse_target("redis://app:s%40cret@h:1/0", username="ops", password="other")
    assert (overridden.username, overridden.password) == ("ops", "other")
    password_only = parse_target("redis://:pw@h:1/0")
    assert (password_only.username, password_only.password) == (None, "pw")


def test_the_description_never_shows_the_password() -> None:
    target = parse_target("redis://app:hunter2@h:1/2", password="hunter3")
    assert target.describe() == "redis://app@h:1/2"
    assert "hunter" not in repr(target)


def test_a_sentinel_url_lists_the_sentinels_the_master_name_and_the_database() -> None:
    target = parse_target("redis+sentinel://:pw@s1:26380,s2,[::1]:26381/mymaster/4")
    assert target.sentinel
    assert target.hosts == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (target.master_name, target.db, target.password) == ("mymaster", 4, "pw")
    assert target.describe() == "redis+sentinel://s1:26380,s2:26379,[::1]:26381/mymaster/4"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "master name"),
        ("redis://h:1/0?ssl_cert_reqs=none", "no ?query"),
        ("redis://h1:1,h2:2/0", "several hosts only with redis+sentinel"),
        ("redis://h:1/zero", "database must be a number"),
        ("redis://h:99999/0", "not HOST or HOST:PORT"),
    ],
)
def test_a_malformed_url_is_refused_naming_the_problem(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as refused:
        parse_target(url)
    assert str(refused.value).startswith("--store=")


def test_a_refused_url_does_not_echo_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_target("redis://app:hunter2@h:1/0?x=1")
    assert "hunter2" not in str(refused.value)


def test_tls_files_with_a_plain_url_are_refused() -> None:
    with pytest.raises(ConfigError, match="only applies to a rediss://"):
        parse_target("redis://h:1/0", ca_file="/etc/ssl/certs/ca-certificates.crt")


def test_a_sentinel_password_without_sentinels_is_refused() -> None:
    with pytest.raises(ConfigError, match="only applies to a redis\\+sentinel://"):
        parse_target("redis://h:1/0", sentinel_password="x")


def test_the_lease_keys_share_one_cluster_slot() -> None:
    """The hash tag keeps the holder and the term in one slot, so one script may touch both."""
    holder, term, channel = lease_keys("my-app")
    assert holder == "leader-sidecar:{my-app}:holder"
    assert term == "leader-sidecar:{my-app}:term"
    assert channel == "leader-sidecar:{my-app}:events"
    assert key_slot(holder.encode()) == key_slot(term.encode())


def test_the_store_takes_its_settings_from_the_configuration() -> None:
    config = load(
        [
            "--store",
            "redis://app:from-url@127.0.0.1:6390/2",
            "--lease",
            "jobs",
            "--lease-duration",
            "3s",
            "--redis-min-replicas",
            "1",
        ],
        {"LEADER_SIDECAR_REDIS_PASSWORD": "from-env"},
    )
    store = open_redis_store(config)
    assert store.target.password == "from-env"
    assert store.target.username == "app"
    assert store.min_replicas == 1
    assert store.request_timeout == config.timing.request_timeout
    assert store.wait_timeout < store.request_timeout
    assert store.description == "redis://app@127.0.0.1:6390/2 lease=jobs"


def test_a_ca_file_that_is_not_a_certificate_stops_the_sidecar_at_start_up(
    tmp_path: Path,
) -> None:
    """Exit status 2 and one line naming the flag, not a failure on every request later."""
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "--store",
            "rediss://127.0.0.1:1/0",
            "--redis-ca-file",
            str(bogus),
            "--listen",
            "127.0.0.1:0",
            "--public-listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"leader-sidecar: --redis-ca-file={bogus}: cannot be loaded")


def test_a_client_certificate_without_its_key_is_refused_by_configuration(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "client.crt"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="go together"):
        load(["--store", "rediss://h:1/0", "--redis-cert-file", str(cert)], ENV)
