"""A candidate as the JSON object the key-value stores keep it in (redis, etcd, a Kubernetes
annotation): one field order and spelling for the writers, one checked reading for the readers
(`sidecar.backends.records`: a value that is not ours is left out of the group, not the whole
group)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sidecar.backends import records
from sidecar.backends.base import Candidate


def candidate_object(
    candidate: Candidate,
    version: str,
    beat_at: datetime,
    *,
    with_identity: bool = True,
    beat_field: str = "beat_at",
) -> dict[str, Any]:
    """The fields a beat writes, in the order every store writes them. ``with_identity``:
    False where the key is the identity already (a redis hash field)."""
    fields: dict[str, Any] = {"identity": candidate.identity} if with_identity else {}
    fields.update(
        version=version,
        revision=candidate.revision,
        priority=candidate.priority,
        leaving=candidate.leaving,
        app=candidate.app,
        started_at=None if candidate.started_at is None else candidate.started_at.isoformat(),
    )
    fields[beat_field] = beat_at.isoformat()
    return fields


def encode(fields: dict[str, Any]) -> str:
    """Compact JSON: a group of 100 candidates is read on every renew interval."""
    return json.dumps(fields, separators=(",", ":"))


def decode(
    where: object,
    value: object,
    *,
    identity: str | None = None,
    beat_field: str = "beat_at",
    show_value: bool = False,
) -> Candidate:
    """The candidate ``value`` holds, checked; ``where`` names it when it is unreadable (and
    ``show_value`` shows the value in the problem too). ``identity``: the key's, where the
    object does not repeat it."""
    try:
        raw: Any = json.loads(value) if isinstance(value, str | bytes | bytearray) else None
    except (ValueError, RecursionError):
        raw = None
    if not isinstance(raw, dict):
        problem = "not a JSON object"
        if show_value:
            problem += f" ({records.shown(value)})"
        return records.unreadable_candidate(where, value, problem)
    return records.candidate(
        identity=raw.get("identity") if identity is None else identity,
        version=raw.get("version"),
        revision=raw.get("revision", ""),
        priority=raw.get("priority", 0),
        leaving=raw.get("leaving", False),
        started_at=raw.get("started_at"),
        beat_at=raw.get(beat_field),
        app=raw.get("app", ""),
    )
