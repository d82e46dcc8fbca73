"""The balancer's plan (pure): shares, levelling, and no move when nothing changed."""

from __future__ import annotations

import itertools

from sidecar.balance import plan, share


def counts(holders: dict[str, str | None], moves: list) -> dict[str, int]:
    after = dict(holders)
    for move in moves:
        assert after[move.lease] == move.giver
        after[move.lease] = move.receiver
    result: dict[str, int] = {}
    for holder in after.values():
        assert holder is not None
        result[holder] = result.get(holder, 0) + 1
    return result


def test_the_share_is_the_ceiling() -> None:
    assert [share(16, r) for r in (1, 2, 3, 4, 5, 16, 17)] == [16, 8, 6, 4, 4, 1, 1]
    assert share(1, 0) == 1


def test_everything_on_one_replica_is_levelled_with_the_fewest_moves() -> None:
    holders: dict[str, str | None] = {f"jobs-{i}": "a" for i in range(16)}
    live = ["a", "b", "c", "d", "e"]
    moves = plan(holders, live)
    after = counts(holders, moves)
    assert max(after.values()) == 4
    assert min(after.get(r, 0) for r in live) == 3
    assert len(moves) == 16 - 4  # only a gives; each lease moves once
    assert len({m.lease for m in moves}) == len(moves)


def test_a_new_replica_gets_its_share_from_the_most_loaded() -> None:
    holders: dict[str, str | None] = {f"s-{i}": "abcd"[i % 4] for i in range(16)}
    moves = plan(holders, ["a", "b", "c", "d", "e"])
    assert len(moves) == 3
    assert {m.receiver for m in moves} == {"e"}
    assert sorted(counts(holders, moves).values()) == [3, 3, 3, 3, 4]


def test_a_settled_set_never_moves() -> None:
    """No flapping: every spread within one of each other plans nothing."""
    live = ["a", "b", "c"]
    for owners in itertools.product(live, repeat=5):
        holders: dict[str, str | None] = {f"l-{i}": o for i, o in enumerate(owners)}
        spread = [owners.count(r) for r in live]
        moves = plan(holders, live)
        assert (moves == []) == (max(spread) - min(spread) <= 1), owners


def test_nothing_is_planned_while_a_lease_is_unheld_or_held_by_a_dead_replica() -> None:
    assert plan({"x-0": None, "x-1": "a", "x-2": "a", "x-3": "a"}, ["a", "b"]) == []
    assert plan({"x-0": "dead", "x-1": "a", "x-2": "a", "x-3": "a"}, ["a", "b"]) == []


def test_every_replica_computes_the_same_plan() -> None:
    holders: dict[str, str | None] = {f"s-{i}": "a" if i < 9 else "b" for i in range(12)}
    first = plan(holders, ["a", "b", "c"])
    assert plan(dict(reversed(list(holders.items()))), ["a", "b", "c"]) == first
