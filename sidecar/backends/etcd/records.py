"""What the store keeps in etcd: the keys, the values (JSON, readable with ``etcdctl get``) and
the records they decode to.

Keys, under the prefix of the ``--store`` URL (``leader-sidecar`` by default):

* ``PREFIX/lease/NAME`` — one key per lease. Its value is JSON ``{"holder", "term",
  "duration_ms", "version", "acquired_at", "renewed_at", "handed"?}``; after a release
  ``{"holder": null, "term", "released": true, "version", "duration_ms", "successor"?}``; a
  loss marker ``{"holder": null, "term", "lost": true, "version", "duration_ms"}``.
* ``PREFIX/candidates/GROUP/IDENTITY`` — one key per candidate of a group (`candidates`).

``version`` is a random token, new on every write. It is what the elector compares (rule 2),
with the epoch of the client that saw it (`sidecar.backends.etcd.client`): etcd's
``mod_revision`` alone is not enough, since a cluster restored from an older snapshot counts
its revisions again from there and can show another record under a revision seen before.
Every write is conditional on both the ``mod_revision`` and the exact value the caller saw
(rule 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TypeVar

from sidecar.backends import records
from sidecar.backends.base import LeaseRecord, lost_grant
from sidecar.backends.etcd.api import b64, unb64
from sidecar.backends.kit.versions import new_version


def lease_key(prefix: str, lease: str) -> bytes:
    return f"{prefix}/lease/{lease}".encode()


def candidates_prefix(prefix: str, group: str) -> bytes:
    """Every candidate of ``group``; the trailing ``/`` keeps group ``a`` from reading ``a-b``."""
    return f"{prefix}/candidates/{group}/".encode()


def range_end(prefix: bytes) -> bytes:
    """The end of the key range of everything starting with ``prefix`` (etcd's ``--prefix``)."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


MAX_TXN_OPS = 64
"""Operations per ``Txn`` the client sends at most (etcd refuses more than ``--max-txn-ops``,
128 by default)."""

C = TypeVar("C")


def chunks(items: list[C], size: int) -> Iterator[list[C]]:
    """``items`` in lists of at most ``size``: the ``Txn``s of a larger request."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@dataclasses.dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd answered it."""

    key: bytes
    value: bytes
    mod_revision: int

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> KeyValue:
        return cls(
            key=unb64(raw.get("key")),
            value=unb64(raw.get("value")),
            mod_revision=int(raw.get("mod_revision") or 0),
        )


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


# -- requests -----------------------------------------------------------------------------------


def range_op(key: bytes, end: bytes | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key)}
    if end is not None:
        body["range_end"] = b64(end)
    return body


def same_as(key: bytes, seen: KeyValue | None) -> list[dict[str, Any]]:
    """The compares of "the key holds exactly what was seen": absent (``None``), or the same
    ``mod_revision`` *and* the same value (a restored cluster can reuse a revision)."""
    if seen is None:
        return [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
    return [
        {
            "key": b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(seen.mod_revision),
        },
        {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(seen.value)},
    ]


def put_op(key: bytes, value: bytes) -> dict[str, Any]:
    return {"request_put": {"key": b64(key), "value": b64(value)}}
