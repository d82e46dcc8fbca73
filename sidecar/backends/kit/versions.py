"""Versions, and the epoch a store client tags them with.

A store client keeps one epoch, bumped whenever the server may have lost writes this process
saw (a failed request, a reconnection, a failover, a restore). It is part of every version the
client reports, so an observer restarts its count from what the server shows *now*: an older
record can come back under a version seen before, without the renewals that followed it
(rule 2). A version reported in an earlier epoch names no stored version: no basis for a grant.
"""

from __future__ import annotations

import dataclasses
import secrets

from sidecar.backends.base import LeaseRecord

EPOCH = "~"  # separates a stored version from the epoch it was seen in


def new_version() -> str:
    """A version no write ever had: 64 random bits."""
    return secrets.token_hex(8)


def epoch_tag(epoch: int) -> str:
    """What a client in ``epoch`` appends to every version it reports."""
    return f"{EPOCH}{epoch}"


def tagged(record: LeaseRecord | None, epoch: int) -> LeaseRecord | None:
    """The record with ``epoch`` in its version."""
    if record is None:
        return None
    return dataclasses.replace(record, version=f"{record.version}{epoch_tag(epoch)}")


def untagged(version: str, epoch: int) -> str | None:
    """The stored version a reported one names, or None if it was reported in an epoch other
    than ``epoch`` (observed before the server may have lost writes: no basis for a grant)."""
    stored, _, seen_in = version.rpartition(EPOCH)
    return stored if seen_in == str(epoch) else None
