"""The HTTP API: the localhost listener the app polls, and the public one for the kubelet and
Prometheus. Every answer about leadership is computed at request time (rule 4)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from sidecar.changes import ChangeFeed
from sidecar.config import duration_seconds
from sidecar.elector import Elector, LeaderStatus
from sidecar.limits import DEFAULT_LIMITS, RETRY_AFTER_SECONDS, Limits, Slots
from sidecar.logs import Throttle, log
from sidecar.release_guard import release_refusal

logger = logging.getLogger("sidecar.api")

ELECTOR = web.AppKey("elector", Elector)
ELECTION_ALIVE: web.AppKey[Callable[[], bool]] = web.AppKey("election_alive")
CHANGES = web.AppKey("changes", ChangeFeed)
LONG_POLLS = web.AppKey("long_polls", Slots)
EVENT_STREAMS = web.AppKey("event_streams", Slots)
SCRUB: web.AppKey[Callable[[str], str]] = web.AppKey("scrub")
RELEASE_REFUSALS = web.AppKey("release_refusals", Throttle)

MAX_WAIT = 300.0  # longest long-poll; longer waits are cut to this
SSE_KEEPALIVE = 15.0
_WAIT_HELP = "wait must be 0 or a duration in ASCII digits such as 30, 1.5, 500ms, 2s or 1m"


def parse_wait(text: str) -> float:
    """``wait=`` → seconds, 0 included, in bounded time (see `duration_seconds`)."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise ValueError(_WAIT_HELP)
    return seconds


def status_response(status: LeaderStatus) -> web.Response:
    return web.json_response(
        status.to_json(),
        status=200 if status.leader else 503,
        headers={"ETag": status.etag, "Cache-Control": "no-store"},
    )


def too_busy(what: str, limit: int) -> web.Response:
    """The fast refusal past a limit: 503 and when to come back."""
    return web.json_response(
        {"error": f"too many {what} on this listener (limit {limit}); retry later"},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
    )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def get_leader(request: web.Request) -> web.Response:
    """``200`` when this replica leads now, ``503`` otherwise. ``?wait=SECONDS`` with
    ``If-None-Match: <etag>`` holds the request until the state differs from that ETag."""
    elector = request.app[ELECTOR]
    wait_text = request.query.get("wait")
    etag = request.headers.get("If-None-Match")
    if wait_text is None or etag is None:
        return status_response(elector.status())
    try:
        wait = 0.0 if wait_text == "" else parse_wait(wait_text)
    except ValueError as exc:
        return _error(400, str(exc))  # the value is not echoed: it is the client's
    slots = request.app[LONG_POLLS]
    with slots.take() as granted:
        if not granted:
            return too_busy("long-polls", slots.limit)
        status = await request.app[CHANGES].wait(etag.strip(), min(wait, MAX_WAIT))
    return status_response(status)


async def get_events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: the state on connect and on every change, keep-alives between."""
    slots = request.app[EVENT_STREAMS]
    with slots.take() as granted:
        if not granted:
            return too_busy("event streams", slots.limit)
        return await _stream_events(request)


async def _stream_events(request: web.Request) -> web.StreamResponse:
    elector = request.app[ELECTOR]
    changes = request.app[CHANGES]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    status = elector.status()
    try:
        await response.write(_sse(status))
        while True:
            changed = await changes.wait(status.etag, SSE_KEEPALIVE)
            if changed.etag == status.etag:
                await response.write(b": keep-alive\n\n")
            else:
                status = changed
                await response.write(_sse(status))
    except ConnectionResetError:
        pass  # the client went away
    return response


def _sse(status: LeaderStatus) -> bytes:
    data = json.dumps(status.to_json(), separators=(",", ":"))
    return f"id: {status.etag}\nevent: leader\ndata: {data}\n\n".encode()


async def post_release(request: web.Request) -> web.Response:
    """Step down now (rule 7). Answers the state after stepping down. Refused (403) unless
    the request can only have come from a local program (see `release_refusal`)."""
    refusal = release_refusal(request)
    if refusal is not None:
        throttle = request.app[RELEASE_REFUSALS]  # a page in a loop must not flood the log
        if throttle.allow():
            log(
                logger,
                "info",
                "release refused",
                reason=refusal,
                suppressed=throttle.take_suppressed(),
            )
        return _error(403, refusal)
    elector = request.app[ELECTOR]
    released = await elector.release_from_any_loop("released")
    body = {"released": released, **elector.status().to_json()}
    return web.json_response(body, status=200, headers={"Cache-Control": "no-store"})


async def get_healthz(request: web.Request) -> web.Response:
    """Alive: this answer proves the event loop runs; the election task must run too."""
    if request.app[ELECTION_ALIVE]():
        return web.json_response({"ok": True})
    return web.json_response({"ok": False, "error": "the election task has stopped"}, status=503)


async def get_readyz(request: web.Request) -> web.Response:
    """Ready: the store answered within the last lease duration. Independent of leadership,
    so followers stay ready and rolling updates are not blocked."""
    elector = request.app[ELECTOR]
    if elector.store_answered_within(elector.timing.lease_duration):
        return web.json_response({"ok": True})
    return web.json_response(
        {
            "ok": False,
            "error": f"the store has not answered for a lease ({elector.timing.lease_duration}s)",
            "last_error": request.app[SCRUB](elector.last_error or "") or None,
        },
        status=503,
    )


def _base_app(elector: Elector, limits: Limits, scrub: Callable[[str], str]) -> web.Application:
    """What both listeners share: the elector, the change feed and the waiter limits."""
    app = web.Application()
    app[ELECTOR] = elector
    app[CHANGES] = ChangeFeed(elector)
    app[LONG_POLLS] = Slots("long-polls", limits.max_long_polls)
    app[EVENT_STREAMS] = Slots("event streams", limits.max_event_streams)
    app[SCRUB] = scrub
    app.cleanup_ctx.append(_follow_changes)
    return app


async def _follow_changes(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[CHANGES].follow(), name="change-feed")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _unchanged(text: str) -> str:
    return text


def create_local_app(
    elector: Elector, limits: Limits = DEFAULT_LIMITS, scrub: Callable[[str], str] = _unchanged
) -> web.Application:
    """The localhost listener: the app's view, including ``POST /leader/release``."""
    app = _base_app(elector, limits, scrub)
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/events", get_events)
    app.router.add_post("/leader/release", post_release)
    app[RELEASE_REFUSALS] = Throttle()
    return app


def create_public_app(
    elector: Elector,
    registry: CollectorRegistry,
    election_alive: Callable[[], bool],
    limits: Limits = DEFAULT_LIMITS,
    scrub: Callable[[str], str] = _unchanged,
) -> web.Application:
    """The public listener: metrics, probes and a read-only ``/leader``."""
    app = _base_app(elector, limits, scrub)
    app[ELECTION_ALIVE] = election_alive
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/readyz", get_readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app
