"""Lease stores. `base` is the contract; one folder per store, each describing itself to the
rest of the sidecar (`description`). A store's client library is imported only when that
store is chosen, so the embedded path stays light.

Adding a store is a folder and one line in `STORES` (docs/development.md, "Adding a store").
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sidecar.backends.description import Command, Store, StoreConfig, WrongForm
from sidecar.backends.etcd.description import ETCD
from sidecar.backends.kubernetes.description import KUBERNETES
from sidecar.backends.postgresql.description import POSTGRESQL
from sidecar.backends.redis.description import REDIS
from sidecar.backends.sqlite.description import SQLITE
from sidecar.backends.zookeeper.description import ZOOKEEPER
from sidecar.options import Option

if TYPE_CHECKING:
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor

# The stores ``--store`` chooses from, in the order ``--help`` lists them and their options.
STORES: tuple[Store, ...] = (
    KUBERNETES,
    SQLITE,
    REDIS,
    ETCD,
    POSTGRESQL,
    ZOOKEEPER,
)

IN_CLUSTER = KUBERNETES.example
"""The store in a Kubernetes pod, where no ``--store`` is given."""
EMBEDDED = SQLITE.example
"""The store anywhere else."""

_BY_SCHEME = {scheme: store for store in STORES for scheme in store.schemes}
_BARE = {store.example: store for store in STORES if "://" not in store.example}
"""A store named by a word, not a URL (``kubernetes``)."""
STORE_HELP = "must be " + ", ".join(store.forms for store in STORES)


def default_store(environ: Mapping[str, str]) -> str:
    """In a Kubernetes pod (``KUBERNETES_SERVICE_HOST`` set) the Kubernetes store, else the
    embedded one."""
    return IN_CLUSTER if environ.get("KUBERNETES_SERVICE_HOST") else EMBEDDED


def store_of(url: str) -> Store:
    """The store a checked ``--store`` value names."""
    return _BY_SCHEME[url.partition(":")[0]]


def parse_store(text: str) -> str:
    """``--store``: the URL of one of `STORES`, checked by that store; ValueError saying what
    is allowed."""
    value = text.strip()
    try:
        scheme = urllib.parse.urlsplit(value).scheme
    except ValueError:
        raise ValueError(STORE_HELP) from None
    store = _BY_SCHEME.get(scheme) if scheme else _BARE.get(value)
    try:
        if store is None:
            raise WrongForm()
        return store.check_url(value)
    except WrongForm as exc:
        raise ValueError(f"{exc}: {STORE_HELP}" if str(exc) else STORE_HELP) from None


def store_help() -> str:
    shown = ", ".join(store.shown for store in STORES)
    notes = "".join(f" {store.note}" for store in STORES if store.note)
    return (
        f"where the lease lives: {shown} (default: {IN_CLUSTER} in a cluster, else "
        f"{EMBEDDED}).{notes}"
    )


def store_options() -> tuple[Option, ...]:
    """Every store's own options, in the order of `STORES`."""
    return tuple(option for store in STORES for option in store.options)


def store_commands() -> dict[str, Command]:
    return {command.name: command for store in STORES for command in store.commands}


def open_client(
    config: StoreConfig, supervisor: Supervisor | None = None, *, read_only: bool = False
) -> StoreClient:
    """One connection to the configured store, shared by every lease of this sidecar. The
    tasks the client runs itself (a poller, a pub/sub hub, a shared watch) run under
    ``supervisor`` (see `sidecar.supervisor`). ``read_only``: for a reader that must create
    nothing (``status``); a store that would create its file or schema on first use raises
    `NoStore` instead (the network stores' reads create nothing anyway)."""
    return store_of(config.store).open_client(config, supervisor, read_only)
