"""The followers' reads on a real ZooKeeper server: a burst of changes (a leader's renewals in
one ``multi``) read in a few ``multiRead``s, not a ``getData`` each; every follower still
sees every change; one path the server refuses leaves the others answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from sidecar.backends.base import Candidate, LeaseRecord, Renewal, StoreUnavailable
from sidecar.backends.zookeeper import jute
from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.jute import Node
from sidecar.backends.zookeeper.reads import FollowerReads
from sidecar.backends.zookeeper.target import parse_target
from tests.zookeeper.servers import fresh_chroot, shared_standalone

pytestmark = pytest.mark.slow
LEASE = 30.0
LEASES = 200
# Read requests a follower may send for one burst of 200 changes: the events come in a few
# chunks off the socket, and each chunk's leases go in one request (a read each: 200).
MOST_READS_PER_BURST = 8


def stored(version: str) -> str:
    """A reported version without the client's epoch."""
    return version.rpartition("~")[0]


class Followed:
    """The newest record each followed lease was called with."""

    def __init__(self) -> None:
        self.latest: dict[str, LeaseRecord | None] = {}
        self.changed = asyncio.Event()

    def callback(self, name: str) -> Callable[[LeaseRecord | None], None]:
        def seen(record: LeaseRecord | None) -> None:
            self.latest[name] = record
            self.changed.set()

        return seen

    async def until(self, expected: dict[str, str], timeout: float = 20.0) -> None:
        """Until every lease of ``expected`` was last seen at its stored version."""
        deadline = time.monotonic() + timeout
        while True:
            behind = [
                name
                for name, version in expected.items()
                if (record := self.latest.get(name)) is None or stored(record.version) != version
            ]
            if not behind:
                return
            assert time.monotonic() < deadline, f"{len(behind)} leases not seen: {behind[:5]}"
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                continue


def reads(client: ZooKeeperStoreClient) -> tuple[int, int]:
    """Requests that read znodes: (``multiRead``s, ``getData``s)."""
    return client.session.sent[jute.MULTI_READ], client.session.sent[jute.GET_DATA]


async def test_a_burst_of_renewals_is_read_by_each_follower_in_a_few_requests() -> None:
    """A leader renews 200 leases in one ``multi``; each of two followers sees every lease's
    new version, having sent at most `MOST_READS_PER_BURST` ``multiRead``s for the 200
    changes and no ``getData`` — and again for a second burst right behind the first (events
    arriving while reads are out are read again)."""
    url = shared_standalone().url(fresh_chroot("reads"))
    leader = ZooKeeperStoreClient(parse_target(url), request_timeout=10.0)
    followers = [ZooKeeperStoreClient(parse_target(url), request_timeout=10.0) for _ in range(2)]
    stops = []
    try:
        names = [f"l{i}" for i in range(LEASES)]
        grants = await asyncio.gather(
            *(leader.lease(n).try_acquire("a_1", LEASE, 0, expected=None) for n in names)
        )
        views = [Followed() for _ in followers]
        for follower, view in zip(followers, views, strict=True):
            stops += [follower.lease(n).follow(view.callback(n)) for n in names]
        granted = {n: stored(g.version) for n, g in zip(names, grants, strict=True)}
        for view in views:
            await view.until(granted)
        before = [reads(follower) for follower in followers]

        renewals = [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
        writes = leader.writes
        first = await leader.renew_many(renewals)
        assert leader.writes - writes == 1  # one multi
        second = await leader.renew_many(renewals)
        renewed = {}
        for name, outcome in zip(names, second, strict=True):
            assert isinstance(outcome, LeaseRecord), outcome
            renewed[name] = stored(outcome.version)
        assert all(isinstance(outcome, LeaseRecord) for outcome in first)
        for view in views:
            await view.until(renewed)
        for follower, (multi_reads, get_datas) in zip(followers, before, strict=True):
            sent_multi, sent_get = reads(follower)
            assert sent_get == get_datas, "a follower read a lease alone"
            assert 1 <= sent_multi - multi_reads <= 2 * MOST_READS_PER_BURST
    finally:
        for stop in stops:
            stop()
        for client in (leader, *followers):
            await client.close()


async def test_a_burst_past_one_requests_answer_budget_goes_in_several_and_all_is_seen() -> None:
    """A request's answer stays within its budget by the sizes last seen (values rewritten
    large by hand must not make one answer the session cannot take): a small budget splits
    a burst of 40 changes into requests of a few leases each, and every change is seen."""
    url = shared_standalone().url(fresh_chroot("budget"))
    leader = ZooKeeperStoreClient(parse_target(url), request_timeout=10.0)
    follower = ZooKeeperStoreClient(parse_target(url), request_timeout=10.0)
    stops = []
    try:
        names = [f"l{i}" for i in range(40)]
        grants = await asyncio.gather(
            *(leader.lease(n).try_acquire("a_1", LEASE, 0, expected=None) for n in names)
        )
        view = Followed()
        stops = [follower.lease(n).follow(view.callback(n)) for n in names]
        await view.until({n: stored(g.version) for n, g in zip(names, grants, strict=True)})
        node = follower.seen[f"{follower.leases_path}/l0"]
        assert node is not None
        follower.follower_reads.MOST_BYTES = 4 * (len(node.data) + FollowerReads.PER_PATH)
        before = reads(follower)
        renewed = await leader.renew_many(
            [Renewal(n, "a_1", g.term, LEASE) for n, g in zip(names, grants, strict=True)]
        )
        assert all(isinstance(outcome, LeaseRecord) for outcome in renewed)
        await view.until(
            {
                n: stored(r.version)
                for n, r in zip(names, renewed, strict=True)
                if isinstance(r, LeaseRecord)
            }
        )
        multi_reads = reads(follower)[0] - before[0]
        assert 10 <= multi_reads <= 40
        assert reads(follower)[1] == before[1]
    finally:
        for stop in stops:
            stop()
        await leader.close()
        await follower.close()


async def test_a_path_the_server_refuses_in_a_multiread_leaves_the_others_answered() -> None:
    """One znode of a ``multiRead`` the reader may not read (a digest user's): that path
    answers its own error, the others their znodes and absences; a follower of all three is
    called for the two it can read, at each of their changes."""
    base = shared_standalone().url(fresh_chroot("refused"))
    reader = ZooKeeperStoreClient(parse_target(base), request_timeout=10.0)
    owner = ZooKeeperStoreClient(
        parse_target(base.replace("zookeeper://", "zookeeper://app:right-password@")),
        request_timeout=10.0,
    )
    stops = []
    try:
        # The reader creates the parent first: open to both.
        open_one = await reader.lease("open-1").try_acquire("a_1", LEASE, 0, expected=None)
        open_two = await reader.lease("open-2").try_acquire("a_1", LEASE, 0, expected=None)
        await owner.lease("locked").try_acquire("b_1", LEASE, 0, expected=None)
        paths = [f"{reader.leases_path}/{n}" for n in ("open-1", "locked", "absent", "open-2")]
        answers = await reader.read_many(paths)
        assert isinstance(answers[0], Node)
        assert isinstance(answers[1], StoreUnavailable)
        assert "not authorised" in str(answers[1])
        assert answers[2] is None
        assert isinstance(answers[3], Node)
        assert [reader.record(a).version for a in (answers[0], answers[3])] == [
            open_one.version,
            open_two.version,
        ]

        view = Followed()
        stops = [reader.lease(n).follow(view.callback(n)) for n in ("open-1", "locked", "open-2")]
        await view.until({"open-1": stored(open_one.version), "open-2": stored(open_two.version)})
        batched = reads(reader)
        renewed = await asyncio.gather(
            reader.lease("open-1").renew("a_1", open_one.term, LEASE),
            owner.lease("locked").renew("b_1", 1, LEASE),
            reader.lease("open-2").renew("a_1", open_two.term, LEASE),
        )
        await view.until(
            {"open-1": stored(renewed[0].version), "open-2": stored(renewed[2].version)}
        )
        assert "locked" not in view.latest
        assert reads(reader)[1] == batched[1]  # no getData: the reads went in multiReads
    finally:
        for stop in stops:
            stop()
        await reader.close()
        await owner.close()


async def test_a_group_is_listed_in_one_request_and_a_beat_lists_in_the_same_round_trip() -> None:
    """A listing asks for the children and the records of those it knows in one
    ``multiRead`` (a second only for replicas new since); a beat that lists sends its
    ``setData`` and that ``multiRead`` back to back, and the list holds the beat."""
    url = shared_standalone().url(fresh_chroot("group"))
    mine, theirs = (ZooKeeperStoreClient(parse_target(url), request_timeout=10.0) for _ in "ab")
    try:
        group = mine.candidates("g")
        for i in range(3):
            await theirs.candidates("g").beat(Candidate(f"b_{i}", str(i + 1)), LEASE)
        assert len(await group.list()) == 3  # the first listing learns the names
        before = reads(mine)
        assert {c.identity for c in await group.list()} == {"b_0", "b_1", "b_2"}
        assert reads(mine) == (before[0] + 1, before[1])
        await theirs.candidates("g").beat(Candidate("b_3", "4"), LEASE)
        assert len(await group.list()) == 4
        assert reads(mine) == (before[0] + 3, before[1])  # the new one in a second multiRead

        await group.beat(Candidate("a_1", "10"), LEASE)  # its record exists
        await group.list()
        before = reads(mine)
        writes = mine.session.sent[jute.SET_DATA]
        listed = await group.beat_and_list(Candidate("a_1", "11"), LEASE)
        assert {c.identity: c.version for c in listed}["a_1"] == "11"
        assert len(listed) == 5
        assert reads(mine) == (before[0] + 1, before[1])
        assert mine.session.sent[jute.SET_DATA] == writes + 1
    finally:
        await mine.close()
        await theirs.close()
