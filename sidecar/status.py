"""The values the elector hands out — to the HTTP API, the demotion actions, the metrics and
the stores' own actions (the Kubernetes pod label and Events) — in a module below the elector,
so that none of them imports the state machine."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import hashlib
import json
from datetime import datetime
from typing import Any

from sidecar.clock import iso_utc


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"


@dataclasses.dataclass(frozen=True)
class LeaderStatus:
    """What ``GET /leader`` answers, computed at the moment of the request."""

    leader: bool
    identity: str
    holder: str | None
    term: int
    lease: str
    lease_duration: float
    valid_for: float
    since: datetime | None
    starting: bool = False
    """No answer from the store about this lease yet (the store not open, or not answering):
    ``holder`` and ``term`` say nothing then. Never true of a leader."""

    @functools.cached_property
    def etag(self) -> str:
        """Changes exactly when the leader flag, the holder or the term changes."""
        return _etag(self.leader, self.holder, self.term)

    @functools.cached_property
    def body(self) -> bytes:
        """``to_json`` as the bytes ``GET /leader`` sends, once per status (the elector hands
        out the same status while nothing in it changed). From one millisecond to the next
        only ``valid_for_seconds`` changes: the rest is encoded once per answer around it."""
        before, after = _around_valid_for(
            self.leader, self.identity, self.holder, self.term, self.lease,
            self.lease_duration, self.since, self.starting,
        )  # fmt: skip
        return before + repr(round(self.valid_for, 3)).encode() + after

    def to_json(self) -> dict[str, Any]:
        """``starting`` appears only while true: the answer of a sidecar at work is the same
        as before it was added."""
        answer = {
            "leader": self.leader,
            "identity": self.identity,
            "holder": self.holder,
            "term": self.term,
            "lease": self.lease,
            "lease_duration_seconds": self.lease_duration,
            "valid_for_seconds": round(self.valid_for, 3),
            "since": iso_utc(self.since),
        }
        if self.starting:
            answer["starting"] = True
        return answer


@functools.lru_cache(maxsize=16)
def _around_valid_for(
    leader: bool,
    identity: str,
    holder: str | None,
    term: int,
    lease: str,
    lease_duration: float,
    since: datetime | None,
    starting: bool,
) -> tuple[bytes, bytes]:
    """`LeaderStatus.to_json`'s bytes before and after the value of ``valid_for_seconds``
    (which ``json.dumps`` writes as ``repr`` of the float)."""
    answer = LeaderStatus(
        leader, identity, holder, term, lease, lease_duration, 0.0, since, starting
    ).to_json()
    keys = list(answer)
    at = keys.index("valid_for_seconds")
    head = json.dumps({key: answer[key] for key in keys[:at]})
    tail = json.dumps({key: answer[key] for key in keys[at + 1 :]})
    return (head[:-1] + ', "valid_for_seconds": ').encode(), (", " + tail[1:]).encode()


@functools.lru_cache(maxsize=64)
def _etag(leader: bool, holder: str | None, term: int) -> str:
    key = f"{int(leader)}|{holder or ''}|{term}".encode()
    return '"' + hashlib.sha256(key).hexdigest()[:16] + '"'


@dataclasses.dataclass(frozen=True)
class Transition:
    """A role change, handed to the demotion actions."""

    role: Role
    reason: str  # acquired | lost | deadline | released | shutdown
    status: LeaderStatus
    previous_holder: str | None  # who held the lease before we took it (acquired only)
    settled: asyncio.Event | None = None
    """A step down on purpose (a release or hand-over): set once the store answered it. The
    actions that talk to the store's API server wait for it (`sidecar.demotion`)."""


@dataclasses.dataclass(frozen=True)
class GapAlert:
    """A renewal gap past half the lease: finished (``growing`` False) or still growing."""

    gap: float
    lease_duration: float
    growing: bool
    last_error: str | None
    status: LeaderStatus
