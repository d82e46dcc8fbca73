"""What only a store does around a transition (on Kubernetes: relabel pods, record Events),
and what it is built from. Apart from `sidecar.backends.description`, which every start imports
before its first answer: these are built once the store is open (`Sidecar.open`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.backends.base import LeaseStore
    from sidecar.backends.store_config import StoreConfig
    from sidecar.demotion import Action
    from sidecar.status import GapAlert


@dataclasses.dataclass(frozen=True)
class StoreActions:
    """What only a store can do around a transition (on Kubernetes: relabel pods and record
    Events). Each part is optional."""

    on_transition: Sequence[Action] = ()
    on_gap_alert: Callable[[GapAlert], Awaitable[None]] | None = None
    """A renewal gap past half the lease."""
    on_app_alone: Callable[[str, str | None], Awaitable[None]] | None = None
    """A lease led with the app down and nobody to take it (lease, why)."""


NO_ACTIONS = StoreActions()


@dataclasses.dataclass(frozen=True)
class ActionsContext:
    """What a store's transition actions are built from."""

    config: StoreConfig
    store: LeaseStore
    """The first lease's store."""
    stores: Mapping[str, LeaseStore]
    """Every lease's store, by the name users see."""
    refusing: Callable[[], bool]
    """The sidecar's one store probe says the store refuses: what can wait does not retry."""
