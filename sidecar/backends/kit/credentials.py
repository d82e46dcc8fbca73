"""A store's user, password and TLS files as ``--STORE-*`` options (etcd, ZooKeeper): the
options, their start-up checks, the settings they parse into, and how the flags override the
user and password of the ``--store`` URL."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any, TypeVar

from sidecar.backends.description import StoreSettings, check_files, check_together
from sidecar.config_error import ConfigError
from sidecar.options import Option, parse_text


@dataclasses.dataclass(frozen=True)
class Credentials(StoreSettings):
    """The ``--STORE-username``, ``-password``, ``-ca-file``, ``-cert-file`` and ``-key-file``
    options, parsed; a store's settings subclass it to be told apart."""

    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def secrets(self) -> tuple[str | None, ...]:
        return (self.password,)

    def flags(self) -> dict[str, str | None]:
        """As the keyword arguments of a store's ``parse_target``."""
        return dataclasses.asdict(self)


Settings = TypeVar("Settings", bound=Credentials)


def credential_options(store: str, *, user: str, title: str, ca: str) -> tuple[Option, ...]:
    """``--{store}-*``: ``user`` names the user ("etcd user"), ``title`` the store in the TLS
    options' help, ``ca`` is the CA file's help."""
    return (
        Option(f"--{store}-username", parse_text, f"{user} (overrides the URL's)", "USER"),
        Option(
            f"--{store}-password",
            parse_text,
            f"{user}'s password (overrides the URL's; prefer the environment variable)",
            "PASSWORD",
            secret=True,
        ),
        Option(f"--{store}-ca-file", parse_text, ca, "PATH"),
        Option(f"--{store}-cert-file", parse_text, f"client certificate for {title} TLS", "PATH"),
        Option(f"--{store}-key-file", parse_text, f"client key for {title} TLS", "PATH"),
    )


def check_credentials(values: Mapping[str, Any], store: str) -> None:
    """Every TLS file given exists; a client certificate comes with its key."""
    check_files(values, f"{store}_cert_file", f"{store}_key_file", f"{store}_ca_file")
    check_together(values, f"{store}_cert_file", f"{store}_key_file")


def credentials_of(values: Mapping[str, Any], store: str, settings: type[Settings]) -> Settings:
    return settings(
        username=values.get(f"{store}_username"),
        password=values.get(f"{store}_password"),
        ca_file=values.get(f"{store}_ca_file"),
        cert_file=values.get(f"{store}_cert_file"),
        key_file=values.get(f"{store}_key_file"),
    )


def tls_files_need_tls(
    store: str, tls_scheme: str, scheme: str, ca_file: str | None, cert_file: str | None
) -> None:
    """TLS files on a plain URL are a mistake: say which flag, and which scheme they need."""
    if scheme == tls_scheme:
        return
    for flag, value in ((f"--{store}-ca-file", ca_file), (f"--{store}-cert-file", cert_file)):
        if value:
            article = "an" if tls_scheme[0] in "aeiou" else "a"
            raise ConfigError(flag, value, f"only applies to {article} {tls_scheme}:// (TLS) store")


def user_and_password(
    store: str, userinfo: str, username: str | None, password: str | None
) -> tuple[str | None, str | None]:
    """The user and password: the flags', else the URL's ``user:password@``."""
    url_user, _, url_password = userinfo.partition(":")
    user = username or (urllib.parse.unquote(url_user) or None)
    secret = password or (urllib.parse.unquote(url_password) or None)
    if secret and not user:
        raise ConfigError(
            f"--{store}-password",
            "(hidden)",
            f"needs a user: give --{store}-username or user@ in the URL",
        )
    return user, secret
