"""How many leases each live replica should hold, and which hand-overs get there.

Pure functions, so every replica computes the same plan from the same view: with R live
replicas and N leases nobody holds more than ceil(N/R), and once every lease is held nobody
holds fewer than floor(N/R). A plan moves a lease only from the most loaded replica to the
least loaded one, and only while they differ by two or more, so a settled set never moves
(no flapping). Each move is a clean release naming the receiver, then a grant with a new term.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence


def share(leases: int, replicas: int) -> int:
    """The most leases one replica may hold: ceil(N / R)."""
    return math.ceil(leases / max(1, replicas))


@dataclasses.dataclass(frozen=True)
class Move:
    lease: str
    giver: str
    receiver: str


def plan(holders: Mapping[str, str | None], live: Sequence[str]) -> list[Move]:
    """Moves that level the live replicas' counts. ``holders``: lease → holder as observed
    (None: free, expired or held by a replica not live). Plans nothing while some lease is
    unheld: those are taken first by replicas under their share, which may already level it."""
    if not live or any(holder not in live for holder in holders.values()):
        return []
    held: dict[str, list[str]] = {identity: [] for identity in live}
    for lease, holder in sorted(holders.items()):
        assert holder is not None
        held[holder].append(lease)
    moves: list[Move] = []
    while True:
        giver = max(live, key=lambda identity: (len(held[identity]), identity))
        receiver = min(live, key=lambda identity: (len(held[identity]), identity))
        if len(held[giver]) - len(held[receiver]) < 2:
            return moves
        lease = held[giver].pop()  # the last by name: the same choice on every replica
        held[receiver].append(lease)
        moves.append(Move(lease, giver, receiver))
