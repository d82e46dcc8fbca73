"""`Follower` (issue 24): a Redis watch as calls keeps the order a watch's `Mailbox` gives —
a message that arrives while the record is being read after a (re)subscription is handed on
after the read's record, never before it (it may be newer; the read may not be), and not at
all when the read's record shows it older."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sidecar.backends.base import LeaseRecord
from sidecar.backends.records import lease_record
from sidecar.backends.redis.hub import Follower
from sidecar.supervisor import Supervisor


def _record(version: str) -> LeaseRecord:
    """A message's record: ``"v3"`` (a_1's grant of term 1), or ``"holder:term:version"``
    (an empty holder: released; ``?``: a loss marker)."""
    if ":" not in version:
        return lease_record(holder="a_1", term=1, duration=5.0, version=version)
    holder, term, version = version.split(":")
    if holder == "?":  # a loss marker: the counter without its holder key
        return lease_record(holder=None, term=int(term), duration=0.0, version=version)
    return lease_record(
        holder=holder or None, term=int(term), duration=5.0, version=version,
        released=not holder,
    )  # fmt: skip


class Source:
    """A lease to follow (`FollowSource`) whose messages are versions."""

    def __init__(
        self,
        read: Callable[[], Awaitable[LeaseRecord | None]],
        spawn: Callable[[str, Callable[[], Awaitable[object]]], asyncio.Task[None]],
    ) -> None:
        self.read = read
        self._spawn = spawn
        self.unfollowed: list[Follower] = []

    def message_record(self, payload: str) -> LeaseRecord | None:
        return _record(payload)  # a message is its version here

    async def read_until_it_answers(
        self, sent: Callable[[], None] | None = None
    ) -> LeaseRecord | None:
        if sent is not None:
            sent()  # here the read is sent as soon as its task runs
        return await self.read()

    def spawn(self, name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        return self._spawn(name, work)

    def unfollow(self, follower: Follower) -> None:
        self.unfollowed.append(follower)


async def test_a_message_during_the_read_comes_after_the_reads_record() -> None:
    calls: list[str | None] = []
    answer: asyncio.Future[LeaseRecord | None] = asyncio.get_running_loop().create_future()

    def spawn(name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        async def run() -> None:
            await work()

        return asyncio.create_task(run(), name=name)

    source = Source(lambda: answer, spawn)
    follower = Follower("ch", lambda r: calls.append(r.version if r else None), source)
    follower.deliver("v1")  # no read out: at once
    assert calls == ["v1"]
    follower.subscribed()  # a read goes out
    follower.deliver("v2")  # before the read was sent: superseded by it
    await asyncio.sleep(0)  # the read is sent
    follower.deliver("v3")
    follower.deliver("v4")  # the newest is kept
    assert calls == ["v1"]
    answer.set_result(_record("v3"))
    await asyncio.sleep(0.01)
    assert calls == ["v1", "v3", "v4"]
    follower.deliver("v5")
    follower.stop()
    follower.deliver("v6")
    assert calls == ["v1", "v3", "v4", "v5"]
    assert source.unfollowed == [follower]  # stopping takes it off the hub


async def test_a_read_run_again_after_its_callback_raised_holds_what_comes_meanwhile() -> None:
    """A callback that raises on the read's record is a bug: the supervisor runs the read
    again (counted), and that read is out like any other — a message meanwhile is handed on
    after its record, not before it."""
    calls: list[str | None] = []
    answers: list[asyncio.Future[LeaseRecord | None]] = []
    failed = [False]
    second = asyncio.Event()

    def read() -> asyncio.Future[LeaseRecord | None]:
        answers.append(asyncio.get_running_loop().create_future())
        if len(answers) == 2:
            second.set()
        return answers[-1]

    def callback(record: LeaseRecord | None) -> None:
        if not failed[0]:
            failed[0] = True
            raise RuntimeError("a bug")
        calls.append(record.version if record else None)

    supervisor = Supervisor(backoff=(0.01, 0.01))
    follower = Follower("ch", callback, Source(read, supervisor.spawn))
    follower.subscribed()
    await asyncio.sleep(0)
    answers[0].set_result(_record("v1"))  # the callback raises on it
    await asyncio.wait_for(second.wait(), 2)  # the supervisor reads again
    assert supervisor.failures["redis-watch-read"] == 1
    follower.deliver("v3")  # while the second read is out
    assert calls == []
    answers[1].set_result(_record("v2"))
    await asyncio.sleep(0.01)
    assert calls == ["v2", "v3"]
    follower.stop()


async def test_a_message_held_during_the_read_that_the_record_shows_older_is_dropped() -> None:
    """The pub/sub connection and the read's connection are two: a message published before
    the read ran can arrive after it was sent. Handed on after the read's newer record, it
    would show a leader an earlier holder, and the leader would step down for nothing."""
    calls: list[str | None] = []
    answers: list[asyncio.Future[LeaseRecord | None]] = []

    def read() -> asyncio.Future[LeaseRecord | None]:
        answers.append(asyncio.get_running_loop().create_future())
        return answers[-1]

    def spawn(name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        async def run() -> None:
            await work()

        return asyncio.create_task(run(), name=name)

    follower = Follower("ch", lambda r: calls.append(r.version if r else None), Source(read, spawn))
    cases = [
        # (held message, the read's record, handed on after the record?)
        ("x_1:4:old", "a_1:5:grant", False),  # an earlier term
        (":5:released", "a_1:5:grant", True),  # the term's release: newer
        ("a_1:5:renewed", "a_1:5:grant", True),  # a renewal of the term: either, harmless
        ("a_1:5:grant", ":5:released", False),  # a holder of a term the read shows released
        ("b_1:6:next", ":5:released", True),  # a later term
        ("a_1:5:put-back", "?:5:lost", True),  # the holder's renewal puts a lost grant back
    ]
    for held, read_record, handed_on in cases:
        calls.clear()
        follower.subscribed()
        await asyncio.sleep(0)  # the read is sent
        follower.deliver(held)
        answers[-1].set_result(_record(read_record))
        await asyncio.sleep(0.01)
        expected = [read_record.split(":")[2]] + ([held.split(":")[2]] if handed_on else [])
        assert calls == expected, (held, read_record)
    follower.stop()


async def test_a_message_while_the_read_waits_to_be_sent_is_superseded_by_it() -> None:
    """A read may wait in the queue of reads (`WatchReads`) for seconds at start-up: what
    arrives before it is sent is older than its answer, and is not handed on after it."""
    calls: list[str | None] = []
    answer: asyncio.Future[LeaseRecord | None] = asyncio.get_running_loop().create_future()
    send = asyncio.Event()

    class Queued(Source):
        async def read_until_it_answers(
            self, sent: Callable[[], None] | None = None
        ) -> LeaseRecord | None:
            await send.wait()  # queued
            assert sent is not None
            sent()
            return await answer

    def spawn(name: str, work: Callable[[], Awaitable[object]]) -> asyncio.Task[None]:
        return asyncio.create_task(work(), name=name)  # type: ignore[arg-type]

    follower = Follower(
        "ch", lambda r: calls.append(r.version if r else None), Queued(lambda: answer, spawn)
    )
    follower.subscribed()
    await asyncio.sleep(0)
    follower.deliver("queued")  # while the read waits in the queue
    send.set()
    await asyncio.sleep(0)
    follower.deliver("out")  # while it is out
    answer.set_result(_record("read"))
    await asyncio.sleep(0.01)
    assert calls == ["read", "out"]
    follower.stop()
