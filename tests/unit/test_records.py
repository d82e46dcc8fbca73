"""The boundary check every store's decoding goes through (issue 25): a record with any field
of the wrong type, out of range, too long, or not valid UTF-8 is unreadable, never an
exception; a timestamp that cannot be parsed is ignored; no term past what the store holds is
ever read or written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sidecar.backends.base import TermExhausted
from sidecar.backends.records import MAX_TERM, candidate, check_term, lease_record

GOOD: dict[str, Any] = {
    "holder": "app-0_3f9c2a1b",
    "term": 7,
    "duration": 15.0,
    "version": "v1",
    "released": False,
    "acquired_at": "2026-12-02T09:00:00.123456789Z",
    "renewed_at": datetime(2026, 12, 2, 9, 0, 5, tzinfo=UTC),
}


def test_a_good_record_reads_as_it_is() -> None:
    record = lease_record(**GOOD)
    assert (record.holder, record.term, record.duration) == ("app-0_3f9c2a1b", 7, 15.0)
    assert (record.unreadable, record.ignored) == (None, None)
    assert record.acquired_at == datetime(2026, 12, 2, 9, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("holder", b"\xff\x00", "holder: not text"),
        ("holder", 42, "holder: not text"),
        ("holder", "app\x1b[2J", "control characters"),
        ("holder", "app\r\nforged", "control characters"),
        ("holder", "bad\udcff", "not valid UTF-8"),
        ("holder", "x" * 300, "longer than 256"),
        ("term", "abc", "term: not a whole number"),
        ("term", 7.0, "term: not a whole number"),
        ("term", True, "term: not a whole number"),
        ("term", -1, "outside"),
        ("term", 2**63 - 1, "outside"),
        ("term", MAX_TERM + 1, "outside"),
        ("duration", "15", "duration: not a number"),
        ("duration", float("nan"), "duration: not a number"),
        ("duration", 0, "outside"),
        ("duration", 1e9, "outside"),
        ("released", "yes", "released: not true or false"),
        ("handed", ["v"], "handed: not text"),
    ],
)
def test_a_bad_field_makes_the_record_one_of_unknown_holder(
    field: str, value: object, problem: str
) -> None:
    record = lease_record(**{**GOOD, field: value})
    assert record.unreadable is not None
    assert problem in record.unreadable
    assert field in record.unreadable
    # Unknown holder: never free, never forgotten (a loss marker), term unknown, same version.
    assert (record.holder, record.term, record.free, record.forgotten) == (None, 0, False, False)
    assert record.version == "v1"


def test_the_problem_shown_is_escaped_and_short() -> None:
    record = lease_record(**{**GOOD, "holder": "\x1b]0;pwned\x07" + "y" * 400})
    assert record.unreadable is not None
    assert "\x1b" not in record.unreadable
    assert "\x07" not in record.unreadable
    assert len(record.unreadable) < 200


def test_a_term_past_the_stores_own_bound_is_unreadable() -> None:
    """A Kubernetes Lease holds an int32: a term past it cannot have come from a grant."""
    assert lease_record(**{**GOOD, "term": 2**31 - 1}, max_term=2**31 - 1).unreadable is None
    record = lease_record(**{**GOOD, "term": 2**31}, max_term=2**31 - 1)
    assert record.unreadable is not None
    assert "2147483647" in record.unreadable


def test_a_timestamp_that_cannot_be_read_is_ignored_and_the_record_stays_readable() -> None:
    """Timestamps are for humans and never grant: a fail-over for one would be a loss."""
    record = lease_record(**{**GOOD, "renewed_at": "garbage"})
    assert record.unreadable is None
    assert record.renewed_at is None
    assert record.ignored is not None
    assert "renewed_at" in record.ignored
    assert (record.holder, record.term) == ("app-0_3f9c2a1b", 7)


def test_released_records_and_loss_markers_may_say_no_lease() -> None:
    released = lease_record(holder=None, term=3, duration=0.0, version="r", released=True)
    assert released.free
    assert released.unreadable is None
    held = lease_record(**{**GOOD, "duration": 0.0})
    assert held.unreadable is not None  # a holder with no lease would expire at once


def test_a_candidate_with_a_bad_field_is_left_out_never_handed_a_lease() -> None:
    good = candidate(identity="app-1_aa", version="12", priority=5, leaving=0)
    assert (good.unreadable, good.leaving, good.priority) == (None, False, 5)
    for bad in (
        {"priority": "abc"},
        {"priority": 10**12},
        {"identity": b"\xff\xfe"},
        {"identity": ""},
        {"leaving": 2},
        {"version": None},
        {"revision": 3},
    ):
        record = candidate(**{"identity": "app-1_aa", "version": "12", **bad})
        assert record.unreadable is not None, bad
        assert record.leaving, bad  # whatever reads it ignores the mark, it is never chosen
        assert "\\x" in record.identity or isinstance(record.identity, str)
    started = candidate(identity="app-1_aa", version="12", started_at="not-a-date")
    assert (started.unreadable, started.started_at) == (None, None)
    assert started.ignored is not None


def test_no_term_past_the_bound_is_written() -> None:
    assert check_term(MAX_TERM, MAX_TERM, "memory") == MAX_TERM
    with pytest.raises(TermExhausted, match="refusing to grant term 2147483648") as refused:
        check_term(2**31, 2**31 - 1, "kubernetes lease=demo/jobs")
    assert "docs/operations.md#a-term-past-what-the-store-holds" in str(refused.value)
