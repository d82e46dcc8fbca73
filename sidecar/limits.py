"""How much one listener serves at once, and the counters that enforce it.

Every limit is per listener, so a flood on the public port (reachable from the cluster) cannot
use up what the app needs on localhost, and memory stays bounded under any flood. On the public
listener the long-polls are limited per client address too, so that one neighbour holding
them all cannot make every other client's long-poll answer 503.
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
    max_long_polls_per_peer: int = 8  # of those, from one address (public listener only)
    max_event_streams: int = 16  # ``GET /events`` streams
    idle_timeout: float = 10.0  # to send a complete request head, from connect or last answer


DEFAULT_LIMITS = Limits()


class Slots:
    """A counter with a ceiling, taken for the length of a ``with`` block; with ``per_peer``,
    a ceiling per client address too."""

    def __init__(self, name: str, limit: int, per_peer: int | None = None) -> None:
        self.name = name
        self.limit = limit
        self.per_peer = per_peer
        self.in_use = 0
        self.refused = 0
        self.refused_per_peer = 0  # (counted in `refused` too)
        self._peers: dict[str, int] = {}  # address -> slots held (only those holding any)

    @contextlib.contextmanager
    def take(self, peer: str | None = None) -> Iterator[bool]:
        """Yields True with a slot held, False (and nothing held) when all are taken, or all
        of ``peer``'s."""
        held_by_peer = self._peers.get(peer or "", 0)
        if self.in_use >= self.limit or (
            self.per_peer is not None and held_by_peer >= self.per_peer
        ):
            self.refused += 1
            if self.in_use < self.limit:
                self.refused_per_peer += 1
            yield False
            return
        self.in_use += 1
        key = peer or ""
        self._peers[key] = held_by_peer + 1
        try:
            yield True
        finally:
            self.in_use -= 1
            self._peers[key] -= 1
            if not self._peers[key]:
                del self._peers[key]

    def limited_by_peer(self, peer: str | None) -> bool:
        """Whether ``peer`` alone holds its ceiling (for the refusal's wording)."""
        return self.per_peer is not None and self._peers.get(peer or "", 0) >= self.per_peer
