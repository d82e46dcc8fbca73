"""The etcd store as the rest of the sidecar knows it (`sidecar.backends.description`): the
``--store`` URLs, the ``--etcd-*`` options and how they become the client's target."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecar.backends.description import (
    Store,
    StoreConfig,
    WrongForm,
    check_files,
    check_together,
)
from sidecar.backends.endpoints import netloc_ok
from sidecar.backends.etcd.target import EtcdSettings
from sidecar.options import Option, parse_text

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor

OPTIONS = (
    Option("--etcd-username", parse_text, "etcd user (overrides the URL's)", "USER"),
    Option(
        "--etcd-password",
        parse_text,
        "etcd user's password (overrides the URL's; prefer the environment variable)",
        "PASSWORD",
        secret=True,
    ),
    Option(
        "--etcd-ca-file",
        parse_text,
        "CA bundle that signs the etcd members' certificates (etcds://)",
        "PATH",
    ),
    Option("--etcd-cert-file", parse_text, "client certificate for etcd TLS", "PATH"),
    Option("--etcd-key-file", parse_text, "client key for etcd TLS", "PATH"),
)


def check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if not netloc_ok(parsed.netloc):
        raise WrongForm()
    return url


def check_options(values: Mapping[str, Any], store: str) -> None:
    check_files(values, "etcd_cert_file", "etcd_key_file", "etcd_ca_file")
    check_together(values, "etcd_cert_file", "etcd_key_file")


def settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> EtcdSettings:
    return EtcdSettings(
        username=values.get("etcd_username"),
        password=values.get("etcd_password"),
        ca_file=values.get("etcd_ca_file"),
        cert_file=values.get("etcd_cert_file"),
        key_file=values.get("etcd_key_file"),
    )


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
