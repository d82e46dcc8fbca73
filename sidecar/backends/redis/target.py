"""Where the lease lives: the ``--store`` URL and the ``--redis-*`` flags, parsed and checked
at start-up so a mistake stops the sidecar with the flag's name."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Callable

from sidecar.backends.description import StoreConfig, StoreSettings
from sidecar.backends.endpoints import join_host as join_host  # (the client shows hosts too)
from sidecar.backends.endpoints import split_host_port
from sidecar.backends.tls import flags_context
from sidecar.config_error import ConfigError

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    """Where the lease lives, parsed from ``--store`` and the ``--redis-*`` flags."""

    scheme: str  # redis | rediss | redis+sentinel
    hosts: tuple[tuple[str, int], ...]  # the server, or the sentinels
    db: int = 0
    master_name: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    @property
    def sentinel(self) -> bool:
        return self.scheme == "redis+sentinel"

    def describe(self) -> str:
        """The URL without credentials, for logs."""
        hosts = ",".join(join_host(host, port) for host, port in self.hosts)
        user = f"{self.username}@" if self.username else ""
        if self.sentinel:
            return f"{self.scheme}://{user}{hosts}/{self.master_name}/{self.db}"
        return f"{self.scheme}://{user}{hosts}/{self.db}"


def parse_target(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    sentinel_password: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> RedisTarget:
    """``redis://[user:password@]host[:port][/db]``, ``rediss://…`` (TLS) or
    ``redis+sentinel://[user:password@]host[:port][,host[:port]…]/master-name[/db]``.
    Flag values override the URL's credentials. Raises `ConfigError` naming the problem."""

    def bad(allowed: str) -> ConfigError:
        return ConfigError("--store", _redact(url), allowed)

    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme
    if scheme not in ("redis", "rediss", "redis+sentinel"):
        raise bad("not a redis://, rediss:// or redis+sentinel:// URL")
    if parsed.query or parsed.fragment:
        raise bad(
            "takes no ?query or #fragment: give TLS and credentials as --redis-* flags or "
            "LEADER_SIDECAR_REDIS_* variables"
        )
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    url_user, _, url_password = userinfo.partition(":")
    default_port = DEFAULT_SENTINEL_PORT if scheme == "redis+sentinel" else DEFAULT_PORT
    hosts = tuple(_split_host(part, default_port, bad) for part in hostlist.split(","))
    if scheme != "redis+sentinel" and len(hosts) != 1:
        raise bad("names one host; several hosts only with redis+sentinel://")
    parts = [urllib.parse.unquote(p) for p in parsed.path.split("/") if p]
    master_name = None
    if scheme == "redis+sentinel":
        if not parts:
            raise bad("needs the master name as its path: redis+sentinel://host:port/mymaster")
        master_name, parts = parts[0], parts[1:]
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise bad("the database must be a number, e.g. redis://host:6379/0")
    tls_flags = {"--redis-ca-file": ca_file, "--redis-cert-file": cert_file}
    if scheme != "rediss":
        for flag, value in tls_flags.items():
            if value:
                raise ConfigError(flag, value, "only applies to a rediss:// (TLS) store")
    if sentinel_password and scheme != "redis+sentinel":
        raise ConfigError(
            "--redis-sentinel-password", "(hidden)", "only applies to a redis+sentinel:// store"
        )
    return RedisTarget(
        scheme=scheme,
        hosts=hosts,
        db=int(parts[0]) if parts else 0,
        master_name=master_name,
        username=username or (urllib.parse.unquote(url_user) or None),
        password=password or (urllib.parse.unquote(url_password) or None),
        sentinel_password=sentinel_password,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _split_host(text: str, default_port: int, bad: Callable[[str], ConfigError]) -> tuple[str, int]:
    try:
        return split_host_port(text, default_port)
    except ValueError:
        raise bad(f"{text!r} is not HOST or HOST:PORT") from None


def _redact(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if "@" not in parsed.netloc:
        return url
    userinfo, _, hosts = parsed.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urllib.parse.urlunsplit(parsed._replace(netloc=f"{user}:***@{hosts}"))


def check_tls_files(target: RedisTarget) -> None:
    """Load the CA and client certificate now, so a wrong file stops the sidecar at start-up
    with the flag's name instead of failing every request later."""
    if target.tls:
        flags_context("redis", target.ca_file, target.cert_file, target.key_file)


@dataclasses.dataclass(frozen=True)
class RedisSettings(StoreSettings):
    """The ``--redis-*`` options, parsed: ``Config.store_settings`` with this store."""

    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    min_replicas: int = 0
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)

    def secrets(self) -> tuple[str | None, ...]:
        return (self.password, self.sentinel_password)


def settings_of(config: StoreConfig) -> RedisSettings:
    """The configured ``--redis-*`` options (none given: the defaults)."""
    found = config.store_settings
    return found if isinstance(found, RedisSettings) else RedisSettings()
