"""What the contract suite needs from each store, and how stores register.

A harness module is any ``tests/contract/harness_*.py`` that defines ``HARNESS``: a
`StoreHarnessFactory` — an async context manager factory yielding a `StoreHarness` for one
fresh lease. The conftest discovers them, so adding a store touches no shared file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from sidecar.backends.base import LeaseStore, StoreClient


class StoreHarness(Protocol):
    lease_name: str
    """The lease `new_store` opens; unique to this harness (other names may be derived from
    it, e.g. ``f"{lease_name}-3"``, and are as fresh)."""

    def new_store(self) -> LeaseStore:
        """A new client of the same lease, as another replica would hold."""
        ...

    def new_client(self) -> StoreClient:
        """A new connection to the same store, as another replica would hold (for many leases
        and candidate groups). The harness closes it."""
        ...

    async def reset(self) -> None:
        """Delete everything the store keeps about the lease, its term included."""
        ...


StoreHarnessFactory = Callable[[], AbstractAsyncContextManager[StoreHarness]]
HarnessIterator = AsyncIterator[StoreHarness]
