"""``GET /leader``'s bytes are exactly ``to_json``, encoded once per distinct answer: the elector
hands out the same status while nothing in it changed, to the millisecond."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from sidecar.backends.memory import MemoryLeaseState
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.status import LeaderStatus
from sidecar.timing import Timing
from tests.support.clock import FakeClock
from tests.support.strict_store import StrictStore

TIMING = Timing.build(lease_duration=2.0)

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
    assert json.loads(STATUS.body) == STATUS.to_json()
    assert STATUS.body == json.dumps(STATUS.to_json()).encode()


def test_every_field_that_changes_changes_the_bytes() -> None:
    changes = {
        "leader": False, "identity": "b", "holder": "b", "term": 8, "lease": "other",
        "lease_duration": 10.0, "valid_for": 9.0, "since": datetime(2026, 1, 1, tzinfo=UTC),
        "starting": True,
    }  # fmt: skip
    for field, value in changes.items():
        changed = dataclasses.replace(STATUS, **{field: value})
        assert changed.body != STATUS.body, field
        assert json.loads(changed.body) == changed.to_json(), field


async def test_the_same_millisecond_is_the_same_answer() -> None:
    clock = FakeClock()
    elector = Elector(
        StrictStore(MemoryLeaseState()),
        TIMING,
        "a_0000",
        "jobs",
        metrics=Metrics(CollectorRegistry(), "jobs", TIMING.lease_duration),
        clock=clock,
    )
    before = elector.status()
    assert before.starting
    await elector.step()
    first = elector.status()
    assert first.leader
    assert not first.starting
    assert elector.status() is first  # the bytes too: encoded once
    seen = []
    for _ in range(1000):  # 10 ms in steps of 10 µs
        clock.advance(0.00001)
        status = elector.status()
        if status is not (seen[-1] if seen else first):
            seen.append(status)
    assert len(seen) in (10, 11), [s.valid_for for s in seen]
    assert len({s.body for s in seen}) == len(seen)
    clock.advance(TIMING.lease_duration)  # past the deadline: a follower now
    assert elector.status().leader is False


def test_the_bytes_are_to_json_for_any_field_values() -> None:
    """The bytes are put together around ``valid_for_seconds``: exactly ``json.dumps`` of
    ``to_json`` still, whatever a store's record puts in the holder (quotes, newlines, the
    key's own text, non-ASCII) and whatever the numbers."""
    rng = random.Random(34)
    names = ["a_0000", 'q"\\u0000\n', "é✓", '", "valid_for_seconds": 0.0, "x": "', ""]
    for _ in range(5000):
        status = LeaderStatus(
            leader=rng.random() < 0.5,
            identity=rng.choice(names),
            holder=rng.choice([None, *names]),
            term=rng.randrange(10**15),
            lease=rng.choice(names),
            lease_duration=rng.choice([15.0, 1.5, 0.25, 3600.0]),
            valid_for=rng.random() * rng.choice([0.0, 0.001, 1.0, 15.0, 1e6]),
            since=rng.choice([None, datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=UTC)]),
            starting=rng.random() < 0.3,
        )
        assert status.body == json.dumps(status.to_json()).encode(), status
