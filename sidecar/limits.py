"""How much one listener serves at once, and the counters that enforce it.

Every limit is per listener, so a flood on the public port (reachable from the cluster) cannot
use up what the app needs on localhost, and memory stays bounded under any flood.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

RETRY_AFTER_SECONDS = 1  # what a refused client is told; a lease hand-off takes about as long


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 256  # open connections; then an old quiet one makes room, or 503
    max_long_polls: int = 64  # requests held by ``GET /leader?wait=``
    max_event_streams: int = 16  # ``GET /events`` streams
    idle_timeout: float = 10.0  # to send a complete request head, from connect or last answer


DEFAULT_LIMITS = Limits()


class Slots:
    """A counter with a ceiling, taken for the length of a ``with`` block."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.in_use = 0
        self.refused = 0

    @contextlib.contextmanager
    def take(self) -> Iterator[bool]:
        """Yields True with a slot held, False (and nothing held) when all are taken."""
        if self.in_use >= self.limit:
            self.refused += 1
            yield False
            return
        self.in_use += 1
        try:
            yield True
        finally:
            self.in_use -= 1
