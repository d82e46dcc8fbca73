"""The candidate view a hand-over relies on (`CandidateBeat.follow` and `current`): followed
only while this replica needs the group, never rolled back by a read that answers late, and
not current while a change the stream reported is unread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from sidecar.backends.base import Candidate, StoreUnavailable
from sidecar.backends.memory import MemoryServer, MemoryStoreClient
from sidecar.candidates import CandidateBeat, CandidateView
from sidecar.clock import SYSTEM_CLOCK, Clock
from tests.support.clock import FakeClock

A = Candidate("a_1", "v1")
B = Candidate("b_1", "v1")


class Scripted:
    """A registry the test drives: each read waits for the test's answer (a list, or an
    exception to raise), and the change stream yields what the test puts in."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[list[Candidate] | Exception] = asyncio.Queue()
        self.notices: asyncio.Queue[list[Candidate] | None] = asyncio.Queue()
        self.reads = 0
        self._following = False

    async def beat(self, candidate: Candidate, duration: float) -> None:
        return None

    async def list(self) -> list[Candidate]:
        self.reads += 1
        answer = await self.answers.get()
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def leave(self, identity: str) -> None:
        return None

    async def changes(self) -> AsyncIterator[list[Candidate] | None]:
        self._following = True
        try:
            while True:
                yield await self.notices.get()
        finally:
            self._following = False

    def following(self) -> bool:
        return self._following


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def beat_of(
    registry: object,
    needs_list: Callable[[], bool] = lambda: True,
    *,
    clock: Clock = SYSTEM_CLOCK,
    versions_fresh_for: float = float("inf"),
) -> CandidateBeat:
    return CandidateBeat(
        registry,  # type: ignore[arg-type]
        CandidateView(A, 30.0),
        10.0,
        5.0,
        1.0,
        needs_list=needs_list,
        versions_fresh_for=versions_fresh_for,
        clock=clock,
    )


def identities(beat: CandidateBeat) -> set[str]:
    return {c.identity for c in beat.view.all()}


async def test_only_a_replica_that_needs_the_group_follows_it() -> None:
    """A follower of one lease never hands a lease over: it keeps no stream (on Kubernetes
    every beat of every replica would be an event to it). Leading starts one; losing the
    lease ends it."""
    registry = MemoryStoreClient(MemoryServer()).candidates("jobs")
    needed = False
    beat = beat_of(registry, lambda: needed)
    following = asyncio.create_task(beat.follow())
    try:
        await asyncio.sleep(0.05)
        assert not registry.following()
        needed = True
        beat.wake_follow()
        await until(registry.following)
        needed = False
        beat.wake_follow()
        await until(lambda: not registry.following())
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_read_that_answers_late_never_rolls_the_view_back() -> None:
    """A read begun before a join, answering after the stream brought the join, must not
    take the newcomer out of the view (a hand-over would then skip the newest replica)."""
    registry = Scripted()
    beat = beat_of(registry)
    following = asyncio.create_task(beat.follow())
    try:
        await until(registry.following)
        late = asyncio.create_task(beat.refresh(1.0))  # e.g. a beat's periodic read
        await until(lambda: registry.reads == 1)
        await registry.notices.put([A, B])  # the stream: B joined
        await until(lambda: identities(beat) == {"a_1", "b_1"})
        await registry.answers.put([A])  # the read from before the join answers now
        assert await late
        assert identities(beat) == {"a_1", "b_1"}
        assert beat.current()
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_reported_change_keeps_the_view_not_current_until_a_later_read_answers() -> None:
    """A notice asks for a read; until one begun after it answers, a hand-over reads first.
    A read that fails leaves it so, and the next beat's read makes it current again."""
    registry = Scripted()
    beat = beat_of(registry)
    following = asyncio.create_task(beat.follow())
    try:
        await until(registry.following)
        await registry.notices.put(None)
        await until(lambda: registry.reads == 1)
        assert not beat.current()
        await registry.answers.put(StoreUnavailable("the store is away"))
        await asyncio.sleep(0.02)
        assert not beat.current()
        beating = asyncio.create_task(beat.once())
        await until(lambda: registry.reads == 2)
        await registry.answers.put([A, B])
        assert await beating
        assert beat.current()
        assert identities(beat) == {"a_1", "b_1"}
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_versions_from_a_read_grow_too_old_to_hand_a_lease_over_by() -> None:
    """A stream of notices tells joins and leaves, not beats: the versions in the view are
    those of the last read, and after `versions_fresh_for` a hand-over must read first (the
    successor would find the beat it was chosen by too old and write a grant of its own). A
    stream that brings every record keeps the versions fresh without a read."""
    clock = FakeClock()
    registry = Scripted()
    beat = beat_of(registry, clock=clock, versions_fresh_for=2.0)
    assert not beat.versions_fresh()  # never read
    reading = asyncio.create_task(beat.refresh(1.0))
    await until(lambda: registry.reads == 1)
    await registry.answers.put([A, B])
    assert await reading
    assert beat.versions_fresh()
    clock.advance(1.9)
    assert beat.versions_fresh()
    clock.advance(0.2)
    assert not beat.versions_fresh()
    following = asyncio.create_task(beat.follow())
    try:
        await until(registry.following)
        await registry.notices.put([A, B])  # every record, as a Kubernetes watch brings them
        await until(beat.versions_fresh)
        clock.advance(7.0)  # the stream still counts as bringing every beat (1.5 intervals)
        assert beat.versions_fresh()
        clock.advance(1.0)
        assert not beat.versions_fresh()
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


def test_a_candidate_counts_only_once_its_beats_are_seen_to_advance() -> None:
    """Issue 25: a record seen with one version only (written once, by anything) is never a
    successor nor counted; the next version seen makes it live, for as long as it changes."""
    view = CandidateView(A, 30.0)
    ghost = Candidate("ghost_1", "v1", priority=999_999_999)
    view.observe([A, ghost], at=0.0)
    assert [c.identity for c in view.live(1.0)] == ["a_1"]
    assert [c.identity for c in view.pending(1.0)] == ["ghost_1"]
    view.observe([A, ghost], at=20.0)  # the same version again: still one version seen
    assert [c.identity for c in view.live(20.0)] == ["a_1"]
    assert view.pending(31.0) == []  # and after alive_for it is not even pending
    real = Candidate("b_1", "7")
    view.observe([A, real], at=40.0)
    assert [c.identity for c in view.live(40.0)] == ["a_1"]
    view.observe([A, Candidate("b_1", "8")], at=45.0)  # b beat: seen to advance
    assert [c.identity for c in view.live(46.0)] == ["a_1", "b_1"]
    assert [c.identity for c in view.live(76.0)] == ["a_1"]  # it stopped beating


async def test_a_candidate_record_that_cannot_be_read_is_left_out_and_reported_once() -> None:
    registry = Scripted()
    reported: list[Candidate] = []
    beat = CandidateBeat(
        registry,  # type: ignore[arg-type]
        CandidateView(A, 30.0),
        10.0,
        5.0,
        1.0,
        on_bad=reported.append,
    )
    bad = Candidate("\\xff", "v", leaving=True, unreadable="identity: not text (b'\\xff')")
    odd = Candidate("b_1", "1", ignored="started_at: not an ISO-8601 timestamp ('x')")
    for version in ("1", "1", "2"):
        read = asyncio.create_task(beat.refresh(1.0))
        await registry.answers.put([A, bad, Candidate("b_1", version, ignored=odd.ignored)])
        assert await read
    assert identities(beat) == {"a_1", "b_1"}
    # Each bad record once per version: the unreadable one once, b's version 1 and 2.
    assert [(r.identity, r.version) for r in reported] == [
        ("\\xff", "v"),
        ("b_1", "1"),
        ("b_1", "2"),
    ]
