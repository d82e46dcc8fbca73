"""The one list-then-watch loop (`sidecar.backends.kubernetes.reflector`) against a failing API
server, as client-go's reflector behaves: back-off from 0.8 s doubling to 30 s, reset only
after 2 minutes without a failure, a "very short watch" counted as a failure, ``Retry-After``
obeyed, a jittered wait before a relist after ``410 Gone``.

The loop is given a clock and a sleep that moves it (no real waiting: ten minutes of back-off
take milliseconds), and the fake API server logs each request at that clock: the tests count
requests against the time the loop believes has passed. A loop that does not wait sends
`MOST` requests in well under a second of real time, and the counts say so."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.backends.kubernetes import KubernetesLeaseStore
from sidecar.backends.kubernetes.candidates import KubernetesCandidates
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.fanout import SharedLeaseWatch
from sidecar.backends.kubernetes.reflector import Listed, Pacing, Reflector
from sidecar.backends.kubernetes.watch import Selection
from tests.fakekube import FakeApiServer
from tests.kubernetes.conftest import LEASE, NAMESPACE
from tests.support.clock import FakeClock

MOST = 300
"""Requests after which a run stops whatever the clock says (a loop that does not wait)."""

ONE_LEASE = Selection(NAMESPACE, field_selector=f"metadata.name={LEASE}")


class LoopTime:
    """The loop's clock and sleep: a sleep moves the clock at once. The fake API server logs
    every request at this clock too."""

    def __init__(self, fake: FakeApiServer) -> None:
        self.clock = FakeClock(start=0.0)
        self.slept: list[float] = []
        fake.clock = self.clock.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)

    def pacing(self) -> Pacing:
        return Pacing(clock=self.clock, sleep=self.sleep)


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[KubeApi]:
    api = KubeApi(str(kubeconfig), 2.0)
    yield api
    await api.close()


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "condition not met in time"
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def following(events: AsyncIterator[Any]) -> AsyncIterator[list[Any]]:
    """Iterate ``events`` in a task while the block runs; what it yielded."""
    seen: list[Any] = []

    async def follow() -> None:
        async for event in events:
            seen.append(event)

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError), f"the loop ended: {outcome!r}"


async def run(
    events: AsyncIterator[Any], loop_time: LoopTime, fake: FakeApiServer, seconds: float
) -> list[Any]:
    """Follow ``events`` until the loop's clock has moved ``seconds`` on, or the server has
    seen `MOST` requests."""
    end = loop_time.clock.now() + seconds
    async with following(events) as seen:
        await until(lambda: loop_time.clock.now() >= end or len(sent(fake)) >= MOST, 10.0)
    return seen


def sent(fake: FakeApiServer, *verbs: str) -> list[dict[str, Any]]:
    """The Lease lists and watches the server saw (or only ``verbs``), oldest first."""
    wanted = verbs or ("list", "watch")
    return [r for r in fake.requests if r["resource"] == "leases" and r["verb"] in wanted]


def at_most_one_per_30_s_after_the_first_minute(requests: list[dict[str, Any]]) -> None:
    """client-go's target, and ours: once the back-off is at its cap (30 s, jittered up to
    60 s), one request per 30 s per loop at most. The run covered ten minutes."""
    times = [r["t"] for r in requests]
    assert times[-1] >= 540, f"the run stopped at {times[-1]:.1f} s after {len(times)} requests"
    late = [t for t in times if t > 60]
    assert len(late) <= (times[-1] - 60) / 30 + 1, f"{len(late)} requests after the first minute"


def gaps(requests: list[dict[str, Any]]) -> list[float]:
    return [b["t"] - a["t"] for a, b in itertools.pairwise(requests)]


def reflector(api: KubeApi, loop_time: LoopTime, seed: int = 1) -> Reflector:
    return Reflector(api, ONE_LEASE, "lease", pacing=loop_time.pacing(), rng=random.Random(seed))


# -- the back-off ---------------------------------------------------------------------------


async def test_a_refusing_server_is_retried_after_0_8_s_doubling_to_30_s_jittered(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """Every list answered 500 for ten minutes: the waits are client-go's steps — 0.8 s,
    1.6 s, … up to 30 s — each jittered up to twice as long, and never longer (the cap), so a
    recovered server is asked again within a minute."""
    fake.faults = fake.faults.parse({"errors": [{"status": 500}]})
    loop_time = LoopTime(fake)
    await run(reflector(api, loop_time).events(), loop_time, fake, 600)
    requests = sent(fake)
    assert {r["verb"] for r in requests} == {"list"}
    for step, gap in enumerate(gaps(requests)):
        base = min(30.0, 0.8 * 2**step)
        assert base - 1e-6 <= gap <= 2 * base + 1e-6, (step, gap)
    at_the_cap = [round(gap, 3) for gap in gaps(requests)[6:]]
    assert len(set(at_the_cap)) > 1  # jittered: sidecars refused together do not come back together
    at_most_one_per_30_s_after_the_first_minute(requests)


async def test_a_list_that_succeeds_between_refused_watches_does_not_reset_the_back_off(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """RBAC lets the list through and refuses the watch: every list succeeds, and still the
    loop backs off to 30 s (the candidates loop used to start over after every list: ~25
    list-and-watch pairs per second, for ever)."""
    fake.faults = fake.faults.parse({"forbid": [{"verbs": ["watch"]}]})
    loop_time = LoopTime(fake)
    await run(reflector(api, loop_time).events(), loop_time, fake, 600)
    assert {r["status"] for r in sent(fake, "list")} == {200}
    at_most_one_per_30_s_after_the_first_minute(sent(fake, "list"))
    at_most_one_per_30_s_after_the_first_minute(sent(fake, "watch"))


async def test_the_back_off_starts_over_only_after_two_minutes_without_a_failure(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """Twelve refused lists put the back-off at its cap. The server recovers and the watch
    runs; broken after 100 s of health, it is retried after 30 s or more (not healthy long
    enough); broken again after 121 s of health, within 1.6 s (started over)."""
    fake.faults = fake.faults.parse({"errors": [{"status": 500, "count": 12}]})
    loop_time = LoopTime(fake)

    def watching() -> bool:
        requests = sent(fake)
        return bool(requests) and requests[-1]["verb"] == "watch" and requests[-1]["status"] is None

    async with following(reflector(api, loop_time).events()):
        await until(watching)
        assert len(sent(fake, "list")) == 13
        for healthy, wait in ((100.0, (30.0, 60.0)), (121.0, (0.8, 1.6))):
            loop_time.clock.advance(healthy)
            broken_at, before = loop_time.clock.now(), len(sent(fake))
            assert fake.drop_watches() >= 1  # (the one dropped before may not be gone yet)
            await until(lambda before=before: len(sent(fake)) > before and watching())
            relisted = sent(fake)[before]
            assert relisted["verb"] == "list"
            assert wait[0] - 1e-6 <= relisted["t"] - broken_at <= wait[1] + 1e-6, healthy


# -- the very short watch, through each of the three loops ----------------------------------


def follower(
    kind: str, api: KubeApi, pacing: Pacing
) -> tuple[AsyncIterator[Any], Callable[[], Any]]:
    """The watch of one of the sidecar's three loops, and what closes it."""
    if kind == "lease":
        store = KubernetesLeaseStore(NAMESPACE, LEASE, api=api, owns_api=False, pacing=pacing)
        return store.watch(), store.close
    if kind == "leases":
        selection = Selection(NAMESPACE, label_selector="leader-sidecar/group=jobs")
        shared = SharedLeaseWatch(api, selection, pacing=pacing)
        return shared.subscribe(LEASE), shared.close
    candidates = KubernetesCandidates(api, NAMESPACE, "jobs", pacing=pacing)

    async def nothing() -> None:
        pass

    return candidates.changes(), nothing


@pytest.mark.parametrize("kind", ["lease", "leases", "candidates"])
async def test_a_server_that_ends_every_watch_at_once_gets_one_watch_per_30_s(
    fake: FakeApiServer, api: KubeApi, kind: str
) -> None:
    """A proxy that closes every watch at once with an empty 200: a watch that ends within
    1 s without an event counts as a failure (client-go's "very short watch"), so each loop —
    the one-Lease watch, the namespace watch of many Leases, the candidates — backs off to one
    watch per 30 s instead of thousands per second. It resumes from the listed
    resourceVersion: one list in all."""
    fake.faults = fake.faults.parse({"end_watches": True})
    loop_time = LoopTime(fake)
    events, close = follower(kind, api, loop_time.pacing())
    try:
        await run(events, loop_time, fake, 600)
    finally:
        await close()
    assert len(sent(fake, "list")) == 1
    at_most_one_per_30_s_after_the_first_minute(sent(fake, "watch"))


async def test_a_watch_that_delivered_an_event_is_resumed_at_once(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """Only an empty watch is short: one that ended having delivered an event (here each
    watch sees one change and is then ended by the server's timeoutSeconds) resumes at once,
    without a wait, so a follower keeps learning of changes in milliseconds."""
    store = KubernetesLeaseStore(NAMESPACE, LEASE, api=api, owns_api=False, default_duration=2.0)
    granted = await store.try_acquire("a_1", 2, 0, expected=None)
    loop_time = LoopTime(fake)
    loop = Reflector(api, ONE_LEASE, "lease", watch_timeout=1, pacing=loop_time.pacing())
    async with following(loop.events()) as seen:
        for renewal in range(3):
            await until(lambda renewal=renewal: len(sent(fake, "watch")) == renewal + 1)
            await store.renew("a_1", granted.term, 2)
            await until(lambda renewal=renewal: len(seen) == renewal + 2)
    assert loop_time.slept == []
    assert len(sent(fake, "list")) == 1


# -- Retry-After and 410 --------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("verb", ["list", "watch"])
async def test_a_refused_list_or_watch_is_never_retried_before_retry_after(
    fake: FakeApiServer, api: KubeApi, status: int, verb: str
) -> None:
    """API Priority and Fairness (429) or an overloaded server (503) asks for 5 s: the next
    request comes no sooner, though the back-off alone would wait 0.8 s."""
    refusal = {"status": status, "retry_after": 5, "match": {"verbs": [verb]}}
    fake.faults = fake.faults.parse({"errors": [refusal]})
    loop_time = LoopTime(fake)
    await run(reflector(api, loop_time).events(), loop_time, fake, 60)
    requests = sent(fake)
    refused = [i for i, r in enumerate(requests[:-1]) if r["status"] == status]
    assert len(refused) >= 4
    for i in refused:
        assert requests[i + 1]["t"] - requests[i]["t"] >= 5.0, (i, requests[i + 1])


async def test_a_relist_after_410_gone_waits_a_jittered_back_off(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """Every watch is answered 410 Gone (its resourceVersion compacted away): the loop lists
    again, but only after the back-off's jittered wait, so a server that keeps expiring
    watches is not listed in a tight loop."""
    fake.faults = fake.faults.parse({"expire_watches": True})
    loop_time = LoopTime(fake)
    seen = await run(reflector(api, loop_time).events(), loop_time, fake, 600)
    listed = sum(isinstance(event, Listed) for event in seen)
    assert listed >= len(sent(fake, "list")) - 1  # (the run may stop before the last one)
    requests = sent(fake)
    for before, after in itertools.pairwise(requests):
        if before["verb"] == "watch":
            assert after["verb"] == "list"
            assert after["t"] - before["t"] >= 0.8 - 1e-6
    at_most_one_per_30_s_after_the_first_minute(sent(fake, "list"))


# -- bookmarks ------------------------------------------------------------------------------


async def test_a_bookmark_carries_the_resource_version_the_next_watch_resumes_from(
    fake: FakeApiServer, api: KubeApi
) -> None:
    """Bookmarks are asked for, and the next watch resumes from the bookmark's
    resourceVersion, not from the list's: after a quiet hour, a resume is not a 410."""
    loop = Reflector(api, ONE_LEASE, "lease", watch_timeout=1)
    moved: list[int] = []

    async def follow() -> None:
        async for event in loop.events():
            if isinstance(event, Listed) and not moved:
                moved.append(fake.cluster.bump())  # a write elsewhere in the cluster

    task = asyncio.create_task(follow())
    try:
        await until(lambda: len(sent(fake, "watch")) >= 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    first, second = (str(r["query"]) for r in sent(fake, "watch")[:2])
    assert "allowWatchBookmarks=true" in first
    assert f"resourceVersion={moved[0] - 1}&" in first + "&"
    assert f"resourceVersion={moved[0]}&" in second + "&"
