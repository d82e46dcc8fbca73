"""A store package's names imported when first used, not with the package: every store's
description is read by the configuration whichever store is chosen, and a store's client
library (redis-py, asyncpg, aiohttp) is imported only for the chosen one."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``modules`` from its module."""

    def attribute(name: str) -> Any:
        if name in modules:
            return getattr(importlib.import_module(modules[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return attribute
