"""A lease as the JSON value the key-value stores keep it in (etcd's key, ZooKeeper's znode),
readable with ``etcdctl get`` or ``zkCli.sh get``: one spelling for the writers, one checked
reading for the readers (`sidecar.backends.records`: a value that is not ours is a record of
unknown holder).

The value is ``{"holder", "term", "duration_ms", "version", "acquired_at", "renewed_at",
"handed"?}``; after a release ``{"holder": null, "term", "released": true, "version",
"duration_ms", "successor"?}``; a loss marker ``{"holder": null, "term", "lost": true,
"version", "duration_ms"}``. ``version`` is a random token, new on every write
(`sidecar.backends.kit.versions`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import LeaseRecord, lost_grant
from sidecar.backends.kit.versions import new_version


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def grant_value(
    holder: str,
    term: int,
    duration: float,
    wall: datetime,
    *,
    acquired_at: str | None = None,
    handed: str | None = None,
) -> bytes:
    value: dict[str, Any] = {
        "holder": holder,
        "term": term,
        "duration_ms": ms(duration),
        "version": new_version(),
        "acquired_at": acquired_at or wall.isoformat(),
        "renewed_at": wall.isoformat(),
    }
    if handed is not None:
        value["handed"] = handed
    return encode(value)


def renewal_value(
    record: LeaseRecord | None, identity: str, term: int, duration: float, wall: datetime
) -> bytes | None:
    """What a renewal of ``identity``'s grant of ``term`` writes over ``record``: the grant
    renewed (``handed`` cleared: the first renewal ends a hand-over), or put back where etcd
    lost it (deleted, restored from an older snapshot, a loss marker of that term: rule 5);
    None when the lease is not the caller's (a later grant, someone else's, a release)."""
    if record is not None and record.holder == identity and record.term == term:
        acquired = record.acquired_at.isoformat() if record.acquired_at else None
        return grant_value(identity, term, duration, wall, acquired_at=acquired)
    if lost_grant(record, term):
        return grant_value(identity, term, duration, wall)
    return None


def released_value(term: int, duration: float, successor: str | None) -> bytes:
    value: dict[str, Any] = {
        "holder": None,
        "term": term,
        "released": True,
        "version": new_version(),
        "duration_ms": ms(duration),
    }
    if successor:
        value["successor"] = successor
    return encode(value)


def marker_value(term: int, duration: float) -> bytes:
    return encode(
        {
            "holder": None,
            "term": term,
            "lost": True,
            "version": new_version(),
            "duration_ms": ms(duration),
        }
    )


def decode_record(value: bytes) -> LeaseRecord:
    """The record a lease key holds (its version not yet tagged with an epoch), checked
    (`sidecar.backends.records`): a value that is not ours is a record of unknown holder,
    named by its own version or, where it has none, a digest of it (every write is
    conditional on the exact value seen anyway)."""
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):  # UnicodeDecodeError included
        data = None
    version = data.get("version") if isinstance(data, dict) else None
    if not (isinstance(version, str) and 0 < len(version) <= 64):
        version = "raw." + hashlib.sha256(value).hexdigest()[:32]
    if not isinstance(data, dict):
        return records.unreadable_lease(version, f"not a JSON object ({records.shown(value)})")
    released = data.get("released", False)
    holder = data.get("holder")
    if released is True and holder is not None:
        return records.unreadable_lease(version, f"holder {records.shown(holder)} on a release")
    duration = data.get("duration_ms", 0)
    if type(duration) in (int, float):
        duration = duration / 1000
    return records.lease_record(
        holder=holder,
        term=data.get("term"),
        duration=duration,
        version=version,
        released=released,
        successor=data.get("successor") if released is True else None,
        handed=data.get("handed") if holder is not None else None,
        acquired_at=data.get("acquired_at"),
        renewed_at=data.get("renewed_at"),
    )
