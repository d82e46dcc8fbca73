"""What a store tells the rest of the sidecar about itself: one `Store` per folder under
``sidecar/backends/``, listed in `sidecar.backends`. The configuration, the command line, the
wiring and the redaction of secrets read these descriptions and name no store.

A description is light: it imports its store's client only inside `Store.open_client`, so
that the configuration can read every store's options and the embedded path stays light.

`StoreConfig` and `StoreSettings` live in `sidecar.backends.store_config` (what a store's
transition actions read too) and are named here as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.backends.store_config import NO_SETTINGS as NO_SETTINGS  # named here too
from sidecar.backends.store_config import StoreConfig as StoreConfig
from sidecar.backends.store_config import StoreSettings as StoreSettings
from sidecar.config_error import ConfigError
from sidecar.options import Option

if TYPE_CHECKING:
    from sidecar.backends.actions import ActionsContext, StoreActions
    from sidecar.backends.base import StoreClient
    from sidecar.supervisor import Supervisor


class WrongForm(ValueError):
    """A ``--store`` URL of no form any store takes: the error lists every store's forms,
    after this exception's text when it has one."""


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand of ``leader-sidecar`` that belongs to one store."""

    name: str
    summary: str
    """One line for the server's ``--help``."""
    main: str
    """``module:function`` taking the arguments after the name, returning the exit status;
    imported only when the command runs."""

    def run(self, argv: Sequence[str]) -> int:
        import importlib

        module, _, function = self.main.partition(":")
        main: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), function)
        return main(argv)


def _no_check(values: Mapping[str, Any], store: str) -> None:
    return None


def _no_settings(values: Mapping[str, Any], environ: Mapping[str, str]) -> StoreSettings:
    return NO_SETTINGS


@dataclasses.dataclass(frozen=True)
class Store:
    """One store, as the rest of the sidecar knows it."""

    name: str
    """The folder's name."""
    schemes: tuple[str, ...]
    """The ``--store`` URL schemes it answers (``kubernetes`` is a scheme without ``://``)."""
    forms: str
    """How ``--store`` spells it, for the one-line error that lists every store's forms."""
    shown: str
    """How ``--store --help`` names it."""
    example: str
    """A URL of it that parses (for the tests and the docs)."""
    check_url: Callable[[str], str]
    """``--store``'s value → the URL kept; ValueError saying what is allowed (`WrongForm`:
    not a URL of this store at all)."""
    open_client: Callable[[StoreConfig, Supervisor | None, bool], StoreClient]
    """(config, supervisor, read_only) → the one client every lease of the sidecar shares.
    ``read_only``: a reader that must create nothing (``status``); a store that would create
    its file or schema on first use raises `NoStore` instead."""
    options: tuple[Option, ...] = ()
    option_prefix: str = ""
    """Every option's flag is ``--PREFIX`` or starts with ``--PREFIX-`` (default: the name)."""
    check_options: Callable[[Mapping[str, Any], str], None] = _no_check
    """(the parsed options by dest, the chosen ``--store``) → None: checks of its options
    given, whichever store is chosen (a file that does not exist, flags that go together);
    raises `ConfigError`."""
    settings: Callable[[Mapping[str, Any], Mapping[str, str]], StoreSettings] = _no_settings
    """(the parsed options by dest, the environment) → its settings, when it is chosen;
    raises `ConfigError`."""
    lease_required: str | None = None
    """Why ``--lease`` must be given with this store; None: it defaults to ``default``."""
    namespaced: bool = False
    """Its leases live in a namespace: users name them ``namespace/name``."""
    note: str = ""
    """A sentence for ``--store --help`` (an extra to install)."""
    extras: tuple[tuple[str, str], ...] = ()
    """(what needs it, the command that installs it), for the server's ``--help``."""
    commands: tuple[Command, ...] = ()
    actions: Callable[[ActionsContext], StoreActions] | None = None
    """Its transition actions; None: it has none."""

    @property
    def prefix(self) -> str:
        return self.option_prefix or self.name


def check_files(values: Mapping[str, Any], *dests: str) -> None:
    """Each of these options, when given, names a file that exists."""
    for dest in dests:
        path = values.get(dest)
        if path and not Path(path).is_file():
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(flag, path, "no such file; give the path of a readable file")


def check_together(values: Mapping[str, Any], first: str, second: str) -> None:
    """Two options given both or neither (a client certificate and its key)."""
    if bool(values.get(first)) != bool(values.get(second)):
        flags = ["--" + dest.replace("_", "-") for dest in (first, second)]
        raise ConfigError(
            flags[1],
            values.get(second) or "",
            f"{flags[0]} and {flags[1]} go together; give both or neither",
        )
