"""What the listeners' two apps share — the start-up app (`sidecar.starting_api`) and the API
at work (`sidecar.api`): the keys both put on an app or a request, the ``GET /leader`` answer,
``wait=``, ``/healthz`` and the heartbeat. Light on purpose: the listeners import it before
their first answer, the API at work (the electors, the lease set) only once the store is open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from sidecar.app_check import Heartbeat
from sidecar.limits import Slots
from sidecar.options import duration_seconds

if TYPE_CHECKING:
    from sidecar.status import LeaderStatus

HEALTH: web.AppKey[Callable[[], dict[str, str]]] = web.AppKey("health")
LONG_POLLS = web.AppKey("long_polls", Slots)
EVENT_STREAMS = web.AppKey("event_streams", Slots)
SCRUB: web.AppKey[Callable[[str], str]] = web.AppKey("scrub")
HEARTBEAT = web.AppKey("heartbeat", Heartbeat)

JSON = "application/json; charset=utf-8"  # what web.json_response sends
MAX_WAIT = 300.0  # longest long-poll; longer waits are cut to this
_WAIT_HELP = "wait must be 0 or a duration in ASCII digits such as 30, 1.5, 500ms, 2s or 1m"


def parse_wait(text: str) -> float:
    """``wait=`` → seconds, 0 included, in bounded time (see `duration_seconds`)."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise ValueError(_WAIT_HELP)
    return seconds


def status_response(status: LeaderStatus) -> web.Response:
    return web.Response(
        body=status.body,
        status=200 if status.leader else 503,
        headers={"Content-Type": JSON, "ETag": status.etag, "Cache-Control": "no-store"},
    )


@web.middleware
async def count_heartbeat(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every call of the app to the localhost API is its heartbeat (``--app-heartbeat``); a
    long-poll or an event stream counts for as long as it is held open."""
    heartbeat = request.app[HEARTBEAT]
    held = request.path == "/events" or (
        "wait" in request.query and "If-None-Match" in request.headers
    )
    heartbeat.begin(held)
    try:
        return await handler(request)
    finally:
        heartbeat.end(held)


async def get_healthz(request: web.Request) -> web.Response:
    """Alive: this answer proves the listeners' loop runs; the election task must run too,
    and no background task may be down (waiting to be restarted after a failure: see
    `sidecar.supervisor`). ``503`` names what is down, so the kubelet restarts a sidecar
    whose task keeps failing."""
    down = request.app[HEALTH]()
    if not down:
        return web.json_response({"ok": True})
    scrub = request.app[SCRUB]
    names = ", ".join(sorted(down))
    return web.json_response(
        {
            "ok": False,
            "error": f"down: {names}",
            "down": {name: scrub(error) for name, error in sorted(down.items())},
        },
        status=503,
        headers={"Cache-Control": "no-store"},
    )
