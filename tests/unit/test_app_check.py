"""The app check (`sidecar.app_check`) against a real HTTP server on loopback: a Kubernetes
probe's thresholds, no redirect followed, a slow or huge answer bounded; the heartbeat; the
localhost API's `GET /` and heartbeat; the flags."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sidecar.api import create_local_app, create_public_app, pod_of_holder
from sidecar.app_check import AppCheck, AppCheckSettings, Heartbeat, parse_health_url
from sidecar.backends.base import HOLD_HOLDER, LOST_HOLDER, LeaseRecord
from sidecar.backends.memory import MemoryLeaseStore
from sidecar.config import load
from sidecar.config_error import ConfigError
from sidecar.elector import Elector
from sidecar.metrics import Metrics
from sidecar.observed import LeaseView
from tests.support.clock import FakeClock
from tests.unit.test_api import client_for

TIMING_FAST = dict(period=0.02, timeout=0.2)


class App:
    """A health endpoint whose answer the test sets: a status, a redirect, a stall, a flood."""

    def __init__(self) -> None:
        self.answer = 200
        self.stall = 0.0
        self.flood = False
        self.requests = 0

    async def health(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.stall:
            await asyncio.sleep(self.stall)
        if self.flood:
            response = web.StreamResponse(status=200)
            await response.prepare(request)
            chunk = b"x" * 65536
            for _ in range(16384):  # 1 GiB if anyone read it all
                await response.write(chunk)
            return response
        if 300 <= self.answer < 400:
            raise web.HTTPFound("http://127.0.0.1:9/elsewhere")
        return web.Response(status=self.answer, text="ok")


@pytest.fixture
async def app() -> AsyncIterator[tuple[App, str]]:
    state = App()
    server = web.Application()
    server.router.add_get("/healthz", state.health)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield state, f"http://127.0.0.1:{port}/healthz"
    await runner.cleanup()


async def running(check: AppCheck) -> asyncio.Task[None]:
    return asyncio.create_task(check.run())


async def until(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout}s"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


async def test_an_app_is_down_until_its_check_passes_successes_times_in_a_row(app) -> None:
    state, url = app
    state.answer = 503
    outcomes: list[str] = []
    check = AppCheck(
        AppCheckSettings(health_url=url, successes=2, **TIMING_FAST), count=outcomes.append
    )
    task = await running(check)
    try:
        await until(lambda: len(outcomes) >= 3, 2, "three checks")
        assert not check.up
        assert set(outcomes) == {"down"}
        state.answer = 200
        seen = len(outcomes)
        await until(lambda: check.up, 2, "up")
        assert outcomes[seen:].count("up") >= 2  # two successes in a row, not one
    finally:
        task.cancel()


async def test_failures_in_a_row_turn_an_up_app_down_and_a_blip_does_not(app) -> None:
    """A flapping app must fail ``failures`` times in a row: one failure between successes
    moves nothing."""
    state, url = app
    check = AppCheck(AppCheckSettings(health_url=url, failures=3, **TIMING_FAST))
    changes: list[bool] = []
    check.on_change(changes.append)
    task = await running(check)
    try:
        await until(lambda: check.up, 2, "up")
        for _ in range(5):  # a blip of two failures, then success again
            state.answer = 500
            failures_from = state.requests
            await until(lambda: state.requests >= failures_from + 2, 2, "two failures")  # noqa: B023
            state.answer = 200
            success_from = state.requests
            await until(lambda: state.requests >= success_from + 1, 2, "a success")  # noqa: B023
        assert changes == [True]
        state.answer = 500
        waited = await until(lambda: not check.up, 2, "down")
        assert waited >= 2 * TIMING_FAST["period"]
        assert changes == [True, False]
    finally:
        task.cancel()


async def test_a_redirect_is_a_failure_and_is_not_followed(app) -> None:
    state, url = app
    state.answer = 302
    outcomes: list[str] = []
    check = AppCheck(AppCheckSettings(health_url=url, **TIMING_FAST), count=outcomes.append)
    task = await running(check)
    try:
        await until(lambda: len(outcomes) >= 3, 2, "three checks")
        assert set(outcomes) == {"redirect"}
        assert not check.up
    finally:
        task.cancel()


async def test_a_slow_answer_costs_at_most_the_timeout(app) -> None:
    state, url = app
    state.stall = 5.0
    outcomes: list[str] = []
    check = AppCheck(
        AppCheckSettings(health_url=url, period=0.05, timeout=0.1), count=outcomes.append
    )
    task = await running(check)
    try:
        waited = await until(lambda: len(outcomes) >= 2, 2, "two checks")
        assert set(outcomes) == {"timeout"}
        assert waited < 0.6
    finally:
        task.cancel()


async def test_a_huge_answer_is_never_read(app) -> None:
    """The status line decides; the body (a gigabyte here) is not read, so each check costs
    a few packets and no memory."""
    state, url = app
    state.flood = True
    outcomes: list[str] = []
    check = AppCheck(AppCheckSettings(health_url=url, **TIMING_FAST), count=outcomes.append)
    task = await running(check)
    try:
        waited = await until(lambda: len(outcomes) >= 5, 3, "five checks")
        assert set(outcomes) == {"up"}
        assert check.up
        assert waited < 2.0
    finally:
        task.cancel()


async def test_a_refused_connection_is_a_failure() -> None:
    outcomes: list[str] = []
    check = AppCheck(
        AppCheckSettings(health_url="http://127.0.0.1:9/", **TIMING_FAST), count=outcomes.append
    )
    task = await running(check)
    try:
        await until(lambda: len(outcomes) >= 2, 2, "two checks")
        assert set(outcomes) == {"refused"}
        assert not check.up
    finally:
        task.cancel()


def test_the_heartbeat_counts_calls_within_the_window_and_streams_held_open() -> None:
    clock = FakeClock()
    heartbeat = Heartbeat(2.0, clock)
    assert not heartbeat.beating(clock.now())
    heartbeat.begin(False)
    heartbeat.end(False)
    clock.advance(1.9)
    assert heartbeat.beating(clock.now())
    clock.advance(0.2)
    assert not heartbeat.beating(clock.now())
    heartbeat.begin(True)  # a long-poll held open for a minute keeps it up
    clock.advance(60)
    assert heartbeat.beating(clock.now())
    heartbeat.end(True)
    clock.advance(2.1)
    assert not heartbeat.beating(clock.now())


async def test_a_heartbeat_check_goes_down_when_the_app_stops_calling() -> None:
    check = AppCheck(AppCheckSettings(heartbeat=0.2))
    task = await running(check)
    try:
        await asyncio.sleep(0.05)
        assert not check.up
        check.heartbeat.begin(False)
        check.heartbeat.end(False)
        await until(lambda: check.up, 1, "up at the first call")
        waited = await until(lambda: not check.up, 1, "down once quiet")
        assert 0.1 < waited < 0.5
    finally:
        task.cancel()


def elector_at() -> Elector:
    from prometheus_client import CollectorRegistry

    from sidecar.timing import Timing

    timing = Timing.build(3.0, None, None, None)
    return Elector(
        MemoryLeaseStore(name="x"),
        timing,
        "pod-a_1234",
        "x",
        metrics=Metrics(CollectorRegistry(), "x", 3.0),
    )


async def test_get_root_answers_leader_elector_shape_with_the_holders_pod() -> None:
    elector = elector_at()
    client = await client_for(create_local_app(elector, pod_name="pod-a"))
    try:
        answer = await client.get("/")
        assert answer.status == 200
        assert await answer.json() == {"name": ""}  # nobody holds it yet
        elector.observe(LeaseRecord("pod-b-7f9_0a1b2c3d", 4, 3.0, "v1"))
        assert await (await client.get("/")).json() == {"name": "pod-b-7f9"}
    finally:
        await client.close()


def test_the_pod_of_a_holder_is_never_a_marker_or_a_hold() -> None:
    assert pod_of_holder("web-0_abcd1234", "me_1", "me") == "web-0"
    assert pod_of_holder("me_1", "me_1", "my-pod") == "my-pod"
    assert pod_of_holder(None, "me_1", "me") == ""
    assert pod_of_holder(LOST_HOLDER, "me_1", "me") == ""
    assert pod_of_holder(f"{HOLD_HOLDER} by ops: x_y", "me_1", "me") == ""


async def test_the_heartbeat_is_the_localhost_api_only() -> None:
    """Every call to the localhost API stamps it; the public listener, which the whole
    cluster can reach, never does."""
    from prometheus_client import CollectorRegistry

    elector = elector_at()
    heartbeat = Heartbeat(5.0)
    local = await client_for(create_local_app(elector, heartbeat=heartbeat))
    public = await client_for(create_public_app(elector, CollectorRegistry(), dict))
    try:
        await public.get("/leader")
        assert heartbeat.last_call == float("-inf")
        await local.get("/leader")
        assert heartbeat.last_call > 0
        assert heartbeat.open == 0
    finally:
        await local.close()
        await public.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/healthz",
        "http://example.com/healthz",
        "ftp://127.0.0.1/x",
        "http://user:pw@127.0.0.1/x",
        "127.0.0.1:8080/healthz",
    ],
)
def test_a_health_url_off_the_pod_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="must"):
        parse_health_url(url, environ={})


def test_a_health_url_on_loopback_or_the_pods_own_address_is_taken() -> None:
    for url in ("http://127.0.0.1:8080/healthz", "http://localhost/", "http://[::1]:80/h"):
        assert parse_health_url(url, environ={}) == url
    assert parse_health_url("http://10.1.2.3/h", environ={"POD_IP": "10.1.2.3"})


def test_the_app_flags_name_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"--app-health-period.*only with --app-health-url"):
        load(["--app-health-period", "2s"], environ={})
    with pytest.raises(ConfigError, match=r"--drain-timeout.*needs --app-health-url"):
        load(["--drain-timeout", "5s"], environ={})
    with pytest.raises(ConfigError, match="--app-health-failures"):
        load(["--app-health-url", "http://127.0.0.1/", "--app-health-failures", "0"], environ={})
    config = load(["--app-heartbeat", "3s", "--lease-duration", "6s"], environ={})
    assert config.app.heartbeat == 3.0
    assert config.drain_timeout == 6.0
    assert load([], environ={}).app.configured is False
    assert load([], environ={}).drain_timeout == 0.0


def test_a_hold_never_lengthens_the_wait_after_a_store_loss() -> None:
    """A hold leads nothing, so its length (an hour) bounds no holder's belief that it leads:
    a loss after it is waited out one lease, not one hold."""
    view = LeaseView("me_1", 3.0)
    view.observe(LeaseRecord("a_1", 5, 3.0, "v1"), at=0.0)
    view.observe(LeaseRecord(f"{HOLD_HOLDER} by ops", 6, 3600.0, "v2"), at=1.0)
    view.observe(None, at=2.0)  # the store lost everything
    attempt = view.next_attempt(2.0)
    assert attempt.why == "lost"
    assert attempt.at == pytest.approx(2.0 + 3.0)
