"""Where the leases live in ZooKeeper: the ``--store`` URL, parsed and checked at start-up so
that a mistake stops the sidecar with the setting's name.

``zookeeper://[user:password@]host[:port][,host[:port]…][/chroot]``: the ensemble's servers
(tried in turn, from a random one), and the znode every lease and candidate lives under
(``/leader-sidecar`` by default). A user and password authenticate with ZooKeeper's
``digest`` scheme; the sidecar then creates its znodes readable and writable by that user
alone (docs/zookeeper.md: ACLs).
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable

from sidecar.backends.endpoints import join_host, split_host_port
from sidecar.config_error import ConfigError
from sidecar.redact import redact_url

DEFAULT_PORT = 2181
DEFAULT_CHROOT = "/leader-sidecar"
_CHROOT = re.compile(r"(/[A-Za-z0-9._-]{1,100}){1,10}")


@dataclasses.dataclass(frozen=True)
class ZooKeeperTarget:
    """The ensemble's servers, the chroot and the digest user."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str = DEFAULT_CHROOT
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)

    def describe(self) -> str:
        """The URL without the password, for logs and ``status``."""
        hosts = ",".join(join_host(host, port) for host, port in self.hosts)
        user = f"{self.username}@" if self.username else ""
        return f"zookeeper://{user}{hosts}{self.chroot}"

    @property
    def digest(self) -> bytes | None:
        """The ``digest`` scheme's credential, ``user:password``."""
        if self.username is None:
            return None
        return f"{self.username}:{self.password or ''}".encode()


def parse_target(url: str) -> ZooKeeperTarget:
    """Raises `ConfigError` naming the problem."""

    def bad(allowed: str) -> ConfigError:
        return ConfigError("--store", redact_url(url), allowed)

    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "zookeeper":
        raise bad("not a zookeeper:// URL")
    if parsed.query or parsed.fragment:
        raise bad("takes no ?query or #fragment")
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts = tuple(_split_host(part, bad) for part in hostlist.split(","))
    chroot = urllib.parse.unquote(parsed.path).rstrip("/") or DEFAULT_CHROOT
    if not _CHROOT.fullmatch(chroot) or any(part in (".", "..") for part in chroot.split("/")):
        raise bad(
            "the path is the chroot: up to ten /names of A-Z a-z 0-9 . _ -, "
            "e.g. zookeeper://zk1:2181,zk2:2181/team-a/leases"
        )
    if password and not user:
        raise bad("a password needs a user: zookeeper://user:password@host/…")
    return ZooKeeperTarget(
        hosts=hosts,
        chroot=chroot,
        username=urllib.parse.unquote(user) or None,
        password=urllib.parse.unquote(password) or None,
    )


def _split_host(text: str, bad: Callable[[str], ConfigError]) -> tuple[str, int]:
    try:
        return split_host_port(text, DEFAULT_PORT)
    except ValueError:
        raise bad(f"{text!r} is not HOST or HOST:PORT") from None
