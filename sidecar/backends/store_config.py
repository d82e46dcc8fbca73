"""What a store reads of the sidecar's configuration, and its own settings. Apart from
`sidecar.backends.description` so that what a store builds once it is open (its transition
actions, `sidecar.backends.actions`) can name them without importing the descriptions."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sidecar.timing import Timing


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    """The chosen store's own settings (its options, parsed and checked); a store with
    options subclasses it."""

    def secrets(self) -> tuple[str | None, ...]:
        """The values to scrub from every log line and error (passwords)."""
        return ()

    @property
    def namespace(self) -> str | None:
        """The namespace the store's own configuration names (a kubeconfig context's), the
        default of ``--namespace`` after ``POD_NAMESPACE``; None: it names none."""
        return None


NO_SETTINGS = StoreSettings()


class StoreConfig(Protocol):
    """What a store reads of the configuration (`sidecar.config.Config` is one)."""

    @property
    def store(self) -> str: ...
    @property
    def store_settings(self) -> StoreSettings: ...
    @property
    def lease(self) -> str: ...
    @property
    def lease_names(self) -> tuple[str, ...]: ...
    @property
    def candidate_group(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def identity(self) -> str: ...
    @property
    def timing(self) -> Timing: ...
    @property
    def pod_name(self) -> str | None: ...
    @property
    def role_label_key(self) -> str: ...
