"""The ZooKeeper store as the rest of the sidecar knows it (`sidecar.backends.description`):
the ``--store`` URLs, the ``--zookeeper-*`` options and how they become the client's target."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import (
    Store,
    StoreConfig,
    WrongForm,
    check_files,
    check_together,
)
from sidecar.backends.zookeeper.target import ZooKeeperSettings, parse_target
from sidecar.config_error import ConfigError
from sidecar.options import Option, parse_text

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor


OPTIONS = (
    Option(
        "--zookeeper-username", parse_text, "ZooKeeper digest user (overrides the URL's)", "USER"
    ),
    Option(
        "--zookeeper-password",
        parse_text,
        "ZooKeeper digest user's password (overrides the URL's; prefer the environment variable)",
        "PASSWORD",
        secret=True,
    ),
    Option(
        "--zookeeper-ca-file",
        parse_text,
        "CA bundle that signs the ZooKeeper servers' certificates (zookeepers://)",
        "PATH",
    ),
    Option("--zookeeper-cert-file", parse_text, "client certificate for ZooKeeper TLS", "PATH"),
    Option("--zookeeper-key-file", parse_text, "client key for ZooKeeper TLS", "PATH"),
)


def check_url(url: str) -> str:
    try:
        parse_target(url)
    except ConfigError as exc:
        raise WrongForm(exc.allowed) from None
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_files(values, "zookeeper_cert_file", "zookeeper_key_file", "zookeeper_ca_file")
    check_together(values, "zookeeper_cert_file", "zookeeper_key_file")


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> ZooKeeperSettings:
    return ZooKeeperSettings(
        username=values.get("zookeeper_username"),
        password=values.get("zookeeper_password"),
        ca_file=values.get("zookeeper_ca_file"),
        cert_file=values.get("zookeeper_cert_file"),
        key_file=values.get("zookeeper_key_file"),
    )


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    from sidecar.backends.zookeeper import open_zookeeper_client

    return open_zookeeper_client(config)


ZOOKEEPER = Store(
    name="zookeeper",
    schemes=("zookeeper", "zookeepers"),
    forms="zookeeper://[user:password@]host:2181[,host:2181…][/chroot] or zookeepers://...",
    shown="zookeeper://…, zookeepers://…",
    example="zookeeper://127.0.0.1:2181",
    check_url=check_url,
    open_client=open_client,
    options=OPTIONS,
    check_options=check_options,
    settings=settings,
)
