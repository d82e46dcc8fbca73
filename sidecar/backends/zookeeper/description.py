"""The ZooKeeper store as the rest of the sidecar knows it (`sidecar.backends.description`):
the ``--store`` URLs, the ``--zookeeper-*`` options and how they become the client's target."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import Store, StoreConfig, WrongForm
from sidecar.backends.kit.credentials import check_credentials, credential_options, credentials_of
from sidecar.config_error import ConfigError

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.backends.zookeeper.target import ZooKeeperSettings
    from sidecar.supervisor import Supervisor


OPTIONS = credential_options(
    "zookeeper",
    user="ZooKeeper digest user",
    title="ZooKeeper",
    ca="CA bundle that signs the ZooKeeper servers' certificates (zookeepers://)",
)


def check_url(url: str) -> str:
    from sidecar.backends.zookeeper.target import parse_target

    try:
        parse_target(url)
    except ConfigError as exc:
        raise WrongForm(exc.allowed) from None
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_credentials(values, "zookeeper")


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> ZooKeeperSettings:
    from sidecar.backends.zookeeper.target import ZooKeeperSettings

    return credentials_of(values, "zookeeper", ZooKeeperSettings)


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
