"""Where the leases live in ZooKeeper: the ``--store`` URL, parsed and checked at start-up so
that a mistake stops the sidecar with the setting's name.

``zookeeper://[user:password@]host[:port][,host[:port]…][/chroot]``, or ``zookeepers://…``
for the servers' secure client port (TLS): the ensemble's servers (tried in turn, from a
random one), and the znode every lease and candidate lives under (``/leader-sidecar`` by
default). A user and password (in the URL or the ``--zookeeper-*`` flags) authenticate with
ZooKeeper's ``digest`` scheme; the sidecar then creates its znodes readable and writable by
that user alone (docs/zookeeper.md: ACLs).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.backends.endpoints import join_host, split_host_port
from sidecar.backends.kit.credentials import Credentials, tls_files_need_tls, user_and_password
from sidecar.config_error import ConfigError
from sidecar.redact import redact_url

if TYPE_CHECKING:
    import ssl

    from sidecar.backends.description import StoreConfig

DEFAULT_PORT = 2181
DEFAULT_CHROOT = "/leader-sidecar"
_CHROOT = re.compile(r"(/[A-Za-z0-9._-]{1,100}){1,10}")


@dataclasses.dataclass(frozen=True)
class ZooKeeperTarget:
    """The ensemble's servers, the chroot, TLS and the digest user."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str = DEFAULT_CHROOT
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    scheme: str = "zookeeper"  # zookeeper | zookeepers
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "zookeepers"

    def describe(self) -> str:
        """The URL without the password, for logs and ``status``."""
        hosts = ",".join(join_host(host, port) for host, port in self.hosts)
        user = f"{self.username}@" if self.username else ""
        return f"{self.scheme}://{user}{hosts}{self.chroot}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of ``zookeepers://`` (the CA, or the system's, and the client
        certificate); None for plain ``zookeeper://``. Raises `ConfigError` naming the flag."""
        if not self.tls:
            return None
        from sidecar.backends.tls import flags_context  # ssl only for a store that uses it

        return flags_context("zookeeper", self.ca_file, self.cert_file, self.key_file)

    @property
    def digest(self) -> bytes | None:
        """The ``digest`` scheme's credential, ``user:password``."""
        if self.username is None:
            return None
        return f"{self.username}:{self.password or ''}".encode()


def parse_target(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ZooKeeperTarget:
    """Flag values override the URL's credentials. Raises `ConfigError` naming the problem."""

    def bad(allowed: str) -> ConfigError:
        return ConfigError("--store", redact_url(url), allowed)

    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("zookeeper", "zookeepers"):
        raise bad("not a zookeeper:// or zookeepers:// URL")
    if parsed.query or parsed.fragment:
        raise bad(
            "takes no ?query or #fragment: give TLS and credentials as --zookeeper-* flags or "
            "LEADER_SIDECAR_ZOOKEEPER_* variables"
        )
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    hosts = tuple(_split_host(part, bad) for part in hostlist.split(","))
    chroot = urllib.parse.unquote(parsed.path).rstrip("/") or DEFAULT_CHROOT
    if not _CHROOT.fullmatch(chroot) or any(part in (".", "..") for part in chroot.split("/")):
        raise bad(
            "the path is the chroot: up to ten /names of A-Z a-z 0-9 . _ -, "
            "e.g. zookeeper://zk1:2181,zk2:2181/team-a/leases"
        )
    url_user, _, url_password = userinfo.partition(":")
    if url_password and not url_user:
        raise bad("a password needs a user: zookeeper://user:password@host/…")
    tls_files_need_tls("zookeeper", "zookeepers", parsed.scheme, ca_file, cert_file)
    user, secret = user_and_password("zookeeper", userinfo, username, password)
    return ZooKeeperTarget(
        hosts=hosts,
        chroot=chroot,
        username=user,
        password=secret,
        scheme=parsed.scheme,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _split_host(text: str, bad: Callable[[str], ConfigError]) -> tuple[str, int]:
    try:
        return split_host_port(text, DEFAULT_PORT)
    except ValueError:
        raise bad(f"{text!r} is not HOST or HOST:PORT") from None


class ZooKeeperSettings(Credentials):
    """The ``--zookeeper-*`` options, parsed: ``Config.store_settings`` with this store."""


def target_of(config: StoreConfig) -> ZooKeeperTarget:
    """The ensemble of ``--store zookeeper://…`` or ``zookeepers://…`` and the
    ``--zookeeper-*`` flags; its TLS files are loaded now, so a wrong one stops the sidecar at
    start-up."""
    settings = config.store_settings
    if not isinstance(settings, ZooKeeperSettings):
        settings = ZooKeeperSettings()
    target = parse_target(config.store, **settings.flags())
    target.ssl_context()
    return target
