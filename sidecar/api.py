"""The HTTP API: the localhost listener the app polls, and the public one for the kubelet and
Prometheus. Every answer about leadership is computed at request time (rule 4)."""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from sidecar.config import parse_duration
from sidecar.elector import Elector, LeaderStatus

ELECTOR = web.AppKey("elector", Elector)
ELECTION_ALIVE: web.AppKey[Callable[[], bool]] = web.AppKey("election_alive")

MAX_WAIT = 300.0  # longest long-poll; longer waits are cut to this
SSE_KEEPALIVE = 15.0


def status_response(status: LeaderStatus) -> web.Response:
    return web.json_response(
        status.to_json(),
        status=200 if status.leader else 503,
        headers={"ETag": status.etag, "Cache-Control": "no-store"},
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
        wait = 0.0 if wait_text.strip() in ("0", "") else parse_duration(wait_text)
    except ValueError as exc:
        return _error(400, f"wait={wait_text}: {exc}")
    return status_response(await elector.wait_for_change(etag.strip(), min(wait, MAX_WAIT)))


async def get_events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: the state on connect and on every change, keep-alives between."""
    elector = request.app[ELECTOR]
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
            changed = await elector.wait_for_change(status.etag, SSE_KEEPALIVE)
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
    """Step down now (rule 7). Answers the state after stepping down."""
    elector = request.app[ELECTOR]
    released = await elector.release("released")
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
            "last_error": elector.last_error,
        },
        status=503,
    )


def create_local_app(elector: Elector) -> web.Application:
    """The localhost listener: the app's view, including ``POST /leader/release``."""
    app = web.Application()
    app[ELECTOR] = elector
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/events", get_events)
    app.router.add_post("/leader/release", post_release)
    return app


def create_public_app(
    elector: Elector, registry: CollectorRegistry, election_alive: Callable[[], bool]
) -> web.Application:
    """The public listener: metrics, probes and a read-only ``/leader``."""
    app = web.Application()
    app[ELECTOR] = elector
    app[ELECTION_ALIVE] = election_alive
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/readyz", get_readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app
