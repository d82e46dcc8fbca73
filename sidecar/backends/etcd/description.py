"""The etcd store as the rest of the sidecar knows it (`sidecar.backends.description`): the
``--store`` URLs, the ``--etcd-*`` options and how they become the client's target."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import Store, StoreConfig, WrongForm
from sidecar.backends.endpoints import netloc_ok
from sidecar.backends.kit.credentials import check_credentials, credential_options, credentials_of

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.backends.etcd.target import EtcdSettings
    from sidecar.supervisor import Supervisor

OPTIONS = credential_options(
    "etcd",
    user="etcd user",
    title="etcd",
    ca="CA bundle that signs the etcd members' certificates (etcds://)",
)


def check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if not netloc_ok(parsed.netloc):
        raise WrongForm()
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_credentials(values, "etcd")


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> EtcdSettings:
    from sidecar.backends.etcd.target import EtcdSettings

    return credentials_of(values, "etcd", EtcdSettings)


def open_client(config: StoreConfig, supervisor: Supervisor | None, read_only: bool) -> StoreClient:
    from sidecar.backends.etcd import open_etcd_client

    return open_etcd_client(config, supervisor)


ETCD = Store(
    name="etcd",
    schemes=("etcd", "etcds"),
    forms="etcd://host:2379[,host:2379…][/key-prefix] or etcds://...",
    shown="etcd://…, etcds://…",
    example="etcd://127.0.0.1:2379",
    check_url=check_url,
    open_client=open_client,
    options=OPTIONS,
    check_options=check_options,
    settings=settings,
)
