"""What the store keeps in etcd: the keys, and the requests that read and write them.

Keys, under the prefix of the ``--store`` URL (``leader-sidecar`` by default):

* ``PREFIX/lease/NAME`` — one key per lease. Its value is the lease's JSON
  (`sidecar.backends.kit.lease_json`).
* ``PREFIX/candidates/GROUP/IDENTITY`` — one key per candidate of a group (`candidates`).

The value's ``version`` is a random token, new on every write. It is what the elector compares
(rule 2), with the epoch of the client that saw it (`sidecar.backends.etcd.client`): etcd's
``mod_revision`` alone is not enough, since a cluster restored from an older snapshot counts
its revisions again from there and can show another record under a revision seen before.
Every write is conditional on both the ``mod_revision`` and the exact value the caller saw
(rule 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TypeVar

from sidecar.backends.etcd.api import b64, unb64


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
