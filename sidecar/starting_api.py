"""What the listeners answer while the store is not open yet: they start before the store's
driver is imported and its client built (redis-py's import alone is ~0.1 s of CPU), so that a
sidecar answers as soon as any HTTP server could.

``GET /leader`` (and ``/leader/{lease}``) answers what a lease the store has not answered
about yet answers (503, ``"starting": true``, the same ETag; a long-poll on that ETag is held
until the store is open); ``/healthz`` and ``/metrics`` as
they do at work; ``/readyz`` 503. Everything else needs the leases: 503 with ``Retry-After``.
Every answer closes its connection, so that the next request reaches the listener's app at
work (`Listener.serve`) once the store is open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from sidecar.api_shared import (
    EVENT_STREAMS,
    HEALTH,
    HEARTBEAT,
    LONG_POLLS,
    MAX_WAIT,
    SCRUB,
    count_heartbeat,
    get_healthz,
    parse_wait,
    status_response,
)
from sidecar.app_check import Heartbeat
from sidecar.connection import held
from sidecar.limits import RETRY_AFTER_SECONDS, Limits, Slots
from sidecar.status import LeaderStatus

STATUSES: web.AppKey[dict[str, LeaderStatus]] = web.AppKey("statuses")
OPEN = web.AppKey("open", asyncio.Event)
"""Set when the store is open and the listener serves the app at work (`store_open`)."""
NOT_OPEN = "starting: the store is not open yet; retry later"


def starting_statuses(
    identity: str, leases: Sequence[str], lease_duration: float, since: datetime
) -> dict[str, LeaderStatus]:
    """Each lease (by the name it is shown under) as `Elector.status` shows it before the
    store has answered about it."""
    return {
        lease: LeaderStatus(
            leader=False,
            identity=identity,
            holder=None,
            term=0,
            lease=lease,
            lease_duration=lease_duration,
            valid_for=0.0,
            since=since,
            starting=True,
        )
        for lease in leases
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def store_open(app: web.Application) -> None:
    """On the listeners' loop, once the listener serves the app at work: the long-polls held
    here are answered (and closed: the next one reaches the app at work)."""
    app[OPEN].set()


async def _answer(request: web.Request, status: LeaderStatus) -> web.Response:
    """A long-poll on the ETag of this answer is held until the store is open or its wait has
    passed (a wait it cannot parse, or past the limit: answered at once)."""
    wait_text, etag = request.query.get("wait"), request.headers.get("If-None-Match")
    if wait_text is not None and etag is not None and etag.strip() == status.etag:
        slots = request.app[LONG_POLLS]
        with (
            slots.take(request.remote) as granted,
            held(request),
            contextlib.suppress(ValueError, TimeoutError),
        ):
            if granted:
                wait = min(parse_wait(wait_text or "0"), MAX_WAIT)
                async with asyncio.timeout(wait):
                    await request.app[OPEN].wait()
    return status_response(status)


async def get_leader(request: web.Request) -> web.Response:
    statuses = request.app[STATUSES]
    if len(statuses) == 1:
        return await _answer(request, next(iter(statuses.values())))
    example = next(iter(statuses))
    return _error(
        400,
        f"this sidecar runs {len(statuses)} leases: ask GET /leader/{example} for one, or "
        "GET /leases for all",
    )


async def get_named_leader(request: web.Request) -> web.Response:
    status = request.app[STATUSES].get(request.match_info["lease"])
    if status is None:
        return _error(404, "no such lease here; GET /leases lists this sidecar's leases")
    return await _answer(request, status)


async def get_readyz(request: web.Request) -> web.Response:
    return web.json_response(
        {"ok": False, "error": "the store is not open yet", "last_error": None}, status=503
    )


async def not_open(request: web.Request) -> web.Response:
    return web.json_response(
        {"error": NOT_OPEN},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
    )


@web.middleware
async def _close_after(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """No connection outlives the start-up: the next request opens one to the app at work."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # a route this app lacks (404, 405)
        response = exc
    response.force_close()
    return response


def _app(statuses: dict[str, LeaderStatus], limits: Limits) -> web.Application:
    app = web.Application(middlewares=[_close_after])
    app[STATUSES] = statuses
    app[OPEN] = asyncio.Event()
    # The long-polls held until the store is open; the SIGUSR1 dump reads both.
    app[LONG_POLLS] = Slots("long-polls", limits.max_long_polls)
    app[EVENT_STREAMS] = Slots("event streams", limits.max_event_streams)
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/leader/{lease:.+}", get_named_leader)
    return app


def create_starting_local_app(
    statuses: dict[str, LeaderStatus], limits: Limits, heartbeat: Heartbeat | None = None
) -> web.Application:
    """``heartbeat``: the app's calls count from the first (``--app-heartbeat``)."""
    app = _app(statuses, limits)
    if heartbeat is not None:
        app[HEARTBEAT] = heartbeat
        app.middlewares.append(count_heartbeat)
    for path in ("/", "/leases", "/events"):
        app.router.add_get(path, not_open)
    for path in ("/leader/release", "/leader/transfer"):
        app.router.add_post(path, not_open)
    return app


def create_starting_public_app(
    statuses: dict[str, LeaderStatus],
    registry: CollectorRegistry,
    health: Callable[[], dict[str, str]],
    limits: Limits,
    scrub: Callable[[str], str],
) -> web.Application:
    app = _app(statuses, limits)
    app[HEALTH] = health
    app[SCRUB] = scrub
    app.router.add_get("/leases", not_open)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/readyz", get_readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app
