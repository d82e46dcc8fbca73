"""What the modules beside the elector (`sidecar.follower`, `sidecar.release`) need of every
lease: its names, its store and timing, what it has seen, and one counted store request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from sidecar.backends.base import LeaseRecord, LeaseStore
from sidecar.observed import LeaseView
from sidecar.timing import Timing

T = TypeVar("T")


class LeaseHandle(Protocol):
    """One lease as `sidecar.elector.Elector` shows it to its helpers."""

    @property
    def identity(self) -> str: ...

    @property
    def lease(self) -> str: ...

    @property
    def store(self) -> LeaseStore: ...

    @property
    def timing(self) -> Timing: ...

    @property
    def view(self) -> LeaseView: ...

    @property
    def term(self) -> int: ...

    async def request(self, op: str, request: Callable[[], Awaitable[T]], budget: float) -> T:
        """One store request within ``budget`` seconds, counted as this lease's."""
        ...

    def observe(self, record: LeaseRecord | None) -> None: ...
