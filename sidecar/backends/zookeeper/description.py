"""The ZooKeeper store as the rest of the sidecar knows it (`sidecar.backends.description`):
the ``--store`` URL and how it becomes the client's target. It has no options: a ``digest``
user and password go in the URL, which the sidecar scrubs from every line it writes like any
store URL's password."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.backends.description import Store, StoreConfig, WrongForm
from sidecar.backends.zookeeper.target import parse_target
from sidecar.config_error import ConfigError

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor


def check_url(url: str) -> str:
    try:
        parse_target(url)
    except ConfigError as exc:
        raise WrongForm(exc.allowed) from None
    return url


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    from sidecar.backends.zookeeper import open_zookeeper_client

    return open_zookeeper_client(config)


ZOOKEEPER = Store(
    name="zookeeper",
    schemes=("zookeeper",),
    forms="zookeeper://[user:password@]host:2181[,host:2181…][/chroot]",
    shown="zookeeper://…",
    example="zookeeper://127.0.0.1:2181",
    check_url=check_url,
    open_client=open_client,
)
