"""Where the leases live in etcd: the ``--store`` URL and the ``--etcd-*`` flags, parsed and
checked at start-up so that a mistake stops the sidecar with the flag's name."""

from __future__ import annotations

import dataclasses
import re
import ssl
import urllib.parse
from collections.abc import Callable

from sidecar.backends.description import StoreConfig
from sidecar.backends.endpoints import join_host, split_host_port
from sidecar.backends.kit.credentials import Credentials, tls_files_need_tls, user_and_password
from sidecar.backends.tls import flags_context
from sidecar.config_error import ConfigError
from sidecar.redact import redact_url

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "leader-sidecar"
_PREFIX = re.compile(r"[A-Za-z0-9._/-]{1,200}")


@dataclasses.dataclass(frozen=True)
class EtcdTarget:
    """The cluster (its client endpoints, tried in order), the key prefix, TLS and the user."""

    scheme: str  # etcd | etcds
    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "etcds"

    def base_url(self, index: int) -> str:
        host, port = self.endpoints[index]
        return f"{'https' if self.tls else 'http'}://{join_host(host, port)}"

    def describe(self) -> str:
        """The URL without credentials, for logs and ``status``."""
        hosts = ",".join(join_host(host, port) for host, port in self.endpoints)
        user = f"{self.username}@" if self.username else ""
        return f"{self.scheme}://{user}{hosts}/{self.prefix}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of ``etcds://`` (the CA, or the system's, and the client
        certificate); None for plain ``etcd://``. Raises `ConfigError` naming the flag."""
        if not self.tls:
            return None
        return flags_context("etcd", self.ca_file, self.cert_file, self.key_file)


def parse_target(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> EtcdTarget:
    """``etcd://[user:password@]host[:port][,host[:port]…][/key/prefix]`` or ``etcds://…``
    (TLS). Flag values override the URL's credentials. Raises `ConfigError` naming the
    problem."""

    def bad(allowed: str) -> ConfigError:
        return ConfigError("--store", redact_url(url), allowed)

    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("etcd", "etcds"):
        raise bad("not an etcd:// or etcds:// URL")
    if parsed.query or parsed.fragment:
        raise bad(
            "takes no ?query or #fragment: give TLS and credentials as --etcd-* flags or "
            "LEADER_SIDECAR_ETCD_* variables"
        )
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    endpoints = tuple(_split_host(part, bad) for part in hostlist.split(","))
    prefix = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    prefix = urllib.parse.unquote(prefix).rstrip("/") or DEFAULT_PREFIX
    if not _PREFIX.fullmatch(prefix):
        raise bad(
            "the path is the key prefix: at most 200 characters from A-Z a-z 0-9 . _ - /, "
            "e.g. etcd://host:2379/team-a/leases"
        )
    tls_files_need_tls("etcd", "etcds", parsed.scheme, ca_file, cert_file)
    user, secret = user_and_password("etcd", userinfo, username, password)
    return EtcdTarget(
        scheme=parsed.scheme,
        endpoints=endpoints,
        prefix=prefix,
        username=user,
        password=secret,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _split_host(text: str, bad: Callable[[str], ConfigError]) -> tuple[str, int]:
    try:
        return split_host_port(text, DEFAULT_PORT)
    except ValueError:
        raise bad(f"{text!r} is not HOST or HOST:PORT") from None


class EtcdSettings(Credentials):
    """The ``--etcd-*`` options, parsed: ``Config.store_settings`` with this store."""


def settings_of(config: StoreConfig) -> EtcdSettings:
    """The configured ``--etcd-*`` options (none given: the defaults)."""
    found = config.store_settings
    return found if isinstance(found, EtcdSettings) else EtcdSettings()
