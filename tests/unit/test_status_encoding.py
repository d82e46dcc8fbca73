"""``GET /leader``'s bytes are encoded once per distinct answer, and are exactly ``to_json``."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

from sidecar.status import LeaderStatus

STATUS = LeaderStatus(
    leader=True,
    identity="a_0000",
    holder="a_0000",
    term=7,
    lease="jobs",
    lease_duration=15.0,
    valid_for=9.87654,
    since=datetime(2026, 12, 4, 12, 0, tzinfo=UTC),
)


def test_the_encoded_answer_is_to_json() -> None:
    assert json.loads(STATUS.encoded()) == STATUS.to_json()
    assert STATUS.encoded() == json.dumps(STATUS.to_json()).encode()


def test_every_field_that_changes_changes_the_bytes() -> None:
    changes = {
        "leader": False, "identity": "b", "holder": "b", "term": 8, "lease": "other",
        "lease_duration": 10.0, "valid_for": 9.0, "since": datetime(2026, 1, 1, tzinfo=UTC),
        "starting": True,
    }  # fmt: skip
    for field, value in changes.items():
        changed = dataclasses.replace(STATUS, **{field: value})
        assert changed.encoded() != STATUS.encoded(), field
        assert json.loads(changed.encoded()) == changed.to_json(), field


def test_the_same_millisecond_is_the_same_answer() -> None:
    later = dataclasses.replace(STATUS, valid_for=STATUS.valid_for - 0.00001)
    assert later.encoded() is STATUS.encoded()
