"""The HTTP API: the localhost listener the app polls, and the public one for the kubelet and
Prometheus. Every answer about leadership is computed at request time (rule 4)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from sidecar import bounded_json
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
from sidecar.backends.base import is_hold
from sidecar.changes import ChangeFeed
from sidecar.clock import iso_utc
from sidecar.connection import held, holding
from sidecar.elector import Elector
from sidecar.lease_set import LeaseSet, TransferRefused
from sidecar.limits import DEFAULT_LIMITS, RETRY_AFTER_SECONDS, Limits, Slots
from sidecar.logs import Throttle, log
from sidecar.release_guard import release_refusal
from sidecar.status import LeaderStatus
from sidecar.supervisor import Supervisor

logger = logging.getLogger("sidecar.api")

LEASES = web.AppKey("leases", LeaseSet)
SUPERVISOR = web.AppKey("supervisor", Supervisor)
CHANGES = web.AppKey("changes", ChangeFeed)
RELEASE_REFUSALS = web.AppKey("release_refusals", Throttle)
POD_NAME: web.AppKey[str] = web.AppKey("pod_name")

SSE_KEEPALIVE = 15.0


def too_busy(what: str, limit: int, where: str = "on this listener") -> web.Response:
    """The fast refusal past a limit: 503 and when to come back."""
    return web.json_response(
        {"error": f"too many {what} {where} (limit {limit}); retry later"},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
    )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _set_etag(statuses: list[LeaderStatus]) -> str:
    """Changes exactly when some lease's ETag changes."""
    digest = hashlib.sha256("".join(status.etag for status in statuses).encode())
    return '"' + digest.hexdigest()[:16] + '"'


def _several_leases(leases: LeaseSet) -> web.Response:
    """``GET /leader`` of a sidecar of several leases: a 400 that says where to ask (failing
    closed: a client reading ``200`` as leadership never sees one here)."""
    example = next(iter(leases.electors))
    return _error(
        400,
        f"this sidecar runs {len(leases.electors)} leases: ask GET /leader/{example} for "
        "one, or GET /leases for all",
    )


def _named_lease(request: web.Request) -> Elector | web.Response:
    name = request.match_info["lease"]
    elector = request.app[LEASES].get(name)
    if elector is None:
        return _error(404, "no such lease here; GET /leases lists this sidecar's leases")
    return elector


async def get_leader(request: web.Request) -> web.Response:
    """``200`` when this replica leads now, ``503`` otherwise. ``?wait=SECONDS`` with
    ``If-None-Match: <etag>`` holds the request until the state differs from that ETag."""
    leases = request.app[LEASES]
    if len(leases.electors) != 1:
        return _several_leases(leases)
    if request.headers.get("If-None-Match") is None:  # the usual poll, on its shortest path
        return status_response(leases.primary.status())
    return await _leader_answer(request, leases.primary)


async def get_named_leader(request: web.Request) -> web.Response:
    """``GET /leader/{lease}``: ``GET /leader`` for one lease of several."""
    elector = _named_lease(request)
    if isinstance(elector, web.Response):
        return elector
    return await _leader_answer(request, elector)


def _wait_of(request: web.Request) -> float | web.Response | None:
    """``?wait=`` with ``If-None-Match``: seconds to hold; None: answer at once."""
    # If-None-Match first: most polls carry none, and parsing the query costs more.
    if request.headers.get("If-None-Match") is None:
        return None
    wait_text = request.query.get("wait")
    if wait_text is None:
        return None
    try:
        return 0.0 if wait_text == "" else min(parse_wait(wait_text), MAX_WAIT)
    except ValueError as exc:
        return _error(400, str(exc))  # the value is not echoed: it is the client's


async def _leader_answer(request: web.Request, elector: Elector) -> web.Response:
    wait = _wait_of(request)
    if wait is None:  # the usual poll: first, and nothing more than it needs
        return status_response(elector.status())
    if isinstance(wait, web.Response):
        return wait
    slots = request.app[LONG_POLLS]
    with slots.take(request.remote) as granted, held(request) as gone:
        if not granted:
            return _refused_long_poll(request, slots)
        etag = request.headers["If-None-Match"].strip()
        status = await request.app[CHANGES].wait(elector.status, lambda s: s.etag, etag, wait, gone)
    return status_response(status)


def _refused_long_poll(request: web.Request, slots: Slots) -> web.Response:
    if slots.limited_by_peer(request.remote):
        assert slots.per_peer is not None
        return too_busy("long-polls", slots.per_peer, "from this address on this listener")
    return too_busy("long-polls", slots.limit)


async def get_leases(request: web.Request) -> web.Response:
    """Every lease of this sidecar: ``leader``, ``holder``, ``term``, ``valid_for_seconds``
    each; one ETag for the set, and the same long-poll as ``GET /leader``."""
    leases = request.app[LEASES]
    wait = _wait_of(request)
    if isinstance(wait, web.Response):
        return wait
    statuses = leases.statuses()
    if wait is not None:
        slots = request.app[LONG_POLLS]
        with slots.take(request.remote) as granted, held(request) as gone:
            if not granted:
                return _refused_long_poll(request, slots)
            etag = request.headers["If-None-Match"].strip()
            statuses = await request.app[CHANGES].wait(leases.statuses, _set_etag, etag, wait, gone)
    with held(request):  # the first answer waits for a read of the store
        candidates = await _candidates(leases)
    body = {
        "identity": leases.identity,
        "held": sum(1 for status in statuses if status.leader),
        "leases": [status.to_json() for status in statuses],
        "candidates": candidates,
    }
    return web.json_response(
        body, headers={"ETag": _set_etag(statuses), "Cache-Control": "no-store"}
    )


_READS: set[asyncio.Task[None]] = set()


async def _candidates(leases: LeaseSet) -> list[dict[str, object]]:
    """As the store's records show them, the same on every replica (`LeaseSet.candidates`):
    the first answer waits for a read; later ones show the last read and start the next in
    the background (at most once a beat), so that an answer about leadership never waits for
    the election's loop — after a pause it would leave judged before it."""
    if leases._shown is None:
        await leases.read_candidates()
    else:
        task = asyncio.ensure_future(leases.read_candidates())
        _READS.add(task)
        task.add_done_callback(_READS.discard)
    return leases.candidates()


async def get_events(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events: every lease's state on connect, then each lease whose state
    changed, keep-alives between."""
    slots = request.app[EVENT_STREAMS]
    with slots.take() as granted, held(request) as gone:
        if not granted:
            return too_busy("event streams", slots.limit)
        return await _stream_events(request, gone)


async def _stream_events(request: web.Request, gone: asyncio.Event | None) -> web.StreamResponse:
    leases = request.app[LEASES]
    changes = request.app[CHANGES]
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    statuses = leases.statuses()
    try:
        await response.write(b"".join(_sse(status) for status in statuses))
        while gone is None or not gone.is_set():
            etag = _set_etag(statuses)
            changed = await changes.wait(leases.statuses, _set_etag, etag, SSE_KEEPALIVE, gone)
            if gone is not None and gone.is_set():
                break
            if _set_etag(changed) == etag:
                await response.write(b": keep-alive\n\n")
                continue
            news = [new for old, new in zip(statuses, changed, strict=True) if new.etag != old.etag]
            statuses = changed
            await response.write(b"".join(_sse(status) for status in news))
    except ConnectionResetError:
        pass  # the client went away
    return response


def _sse(status: LeaderStatus) -> bytes:
    data = json.dumps(status.to_json(), separators=(",", ":"))
    return f"id: {status.etag}\nevent: leader\ndata: {data}\n\n".encode()


MAX_BODY = 4096  # a release or transfer body names a lease and an identity; nothing more
MAX_BODY_DEPTH = 4  # an object of strings is 1 deep; the parser recurses once per level


async def _small_json(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object (``{}`` without a body), read in bounded memory."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return _error(413, f"the body must be at most {MAX_BODY} bytes")
    if not request.can_read_body:
        return {}
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        return _error(413, f"the body must be at most {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        body = bounded_json.loads(raw, MAX_BODY_DEPTH)
    except bounded_json.TooDeep as exc:
        return _error(400, f"the body must be a JSON object of strings; {exc}")
    except ValueError:  # (UnicodeDecodeError included)
        return _error(400, "the body must be a JSON object")
    if not isinstance(body, dict) or not all(isinstance(value, str) for value in body.values()):
        return _error(400, 'the body must be a JSON object of strings, e.g. {"lease": "jobs-3"}')
    return body


def _refused(request: web.Request, what: str) -> web.Response | None:
    refusal = release_refusal(request)
    if refusal is None:
        return None
    throttle = request.app[RELEASE_REFUSALS]  # a page in a loop must not flood the log
    if throttle.allow():
        log(
            logger,
            "info",
            f"{what} refused",
            reason=refusal,
            suppressed=throttle.take_suppressed(),
        )
    return _error(403, refusal)


@holding
async def post_release(request: web.Request) -> web.Response:
    """Step down now (rule 7): the lease named in the body (``{"lease": ...}``), else every
    lease this replica holds. Answers the state after stepping down. Refused (403) unless
    the request can only have come from a local program (see `release_refusal`)."""
    refused = _refused(request, "release")
    if refused is not None:
        return refused
    body = await _small_json(request)
    if isinstance(body, web.Response):
        return body
    leases = request.app[LEASES]
    name = body.get("lease")
    if name is not None and leases.get(name) is None:
        return _error(404, "no such lease here; GET /leases lists this sidecar's leases")
    released = await leases.release(name)
    if len(leases.electors) == 1:
        result: dict[str, Any] = {"released": released, **leases.primary.status().to_json()}
    else:
        result = {"released": released, "leases": [s.to_json() for s in leases.statuses()]}
    return web.json_response(result, status=200, headers={"Cache-Control": "no-store"})


@holding
async def post_transfer(request: web.Request) -> web.Response:
    """Hand leadership to another replica now: ``{"to": "<identity or pod name>"|"any",
    "lease": "<name>"}`` (lease optional: every lease held). The leader demotes, then
    releases naming the successor; the others stand back briefly so that one wins."""
    refused = _refused(request, "transfer")
    if refused is not None:
        return refused
    body = await _small_json(request)
    if isinstance(body, web.Response):
        return body
    to = body.get("to")
    if not to:
        return _error(400, 'name the successor: {"to": "<identity or pod name>"} or {"to": "any"}')
    leases = request.app[LEASES]
    try:
        handed, successor = await leases.transfer(body.get("lease"), to)
    except TransferRefused as exc:
        refused = _error(409, str(exc))
        if exc.retry_after is not None:  # a successor still starting: when to ask again
            refused.headers["Retry-After"] = str(exc.retry_after)
        return refused
    return web.json_response(
        {"transferred": handed, "successor": successor},
        headers={"Cache-Control": "no-store"},
    )


def pod_of_holder(holder: str | None, identity: str, pod_name: str) -> str:
    """The pod name inside a holder's identity (``<pod>_<suffix>``): ours is ``pod_name``;
    no holder, a loss marker or an operator's hold is no pod ("")."""
    if holder is None or "/" in holder or is_hold(holder):
        return ""
    if holder == identity:
        return pod_name
    return holder.rpartition("_")[0] or holder


async def get_root(request: web.Request) -> web.Response:
    """``GET /``: the retired ``leader-elector`` sidecar's answer, ``{"name": "<the leader's pod
    name>"}``, so an app that compares ``name`` with its hostname keeps working when only the
    image changes; nais/elector's ``last_update`` beside it (when the holder was granted the
    lease, by the store's wall clock; absent when unknown). The holder as last observed (a
    follower's view may be a moment old, as theirs was); "" when nobody holds the lease."""
    leases = request.app[LEASES]
    if len(leases.electors) != 1:
        return _several_leases(leases)
    elector = leases.primary
    status = elector.status()
    pod_name = request.app[POD_NAME] or elector.identity.rpartition("_")[0]
    name = pod_of_holder(status.holder, elector.identity, pod_name)
    if status.holder == elector.identity and not status.leader:
        name = ""  # draining or past the deadline: this pod must not act as the leader
    body: dict[str, str] = {"name": name}
    record = elector.view.record
    granted = iso_utc(record.acquired_at) if name and record is not None else None
    if granted is not None:
        body["last_update"] = granted
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def get_readyz(request: web.Request) -> web.Response:
    """Ready: the store answered within the last lease duration. Independent of leadership,
    so followers stay ready and rolling updates are not blocked."""
    leases = request.app[LEASES]
    elector = leases.primary
    if leases.store_answered_within(elector.timing.lease_duration):
        return web.json_response({"ok": True})
    return web.json_response(
        {
            "ok": False,
            "error": f"the store has not answered for a lease ({elector.timing.lease_duration}s)",
            "last_error": request.app[SCRUB](leases.last_error or "") or None,
        },
        status=503,
    )


def _base_app(
    leases: Elector | LeaseSet,
    limits: Limits,
    scrub: Callable[[str], str],
    supervisor: Supervisor | None,
) -> web.Application:
    """What both listeners share: the leases, the change feed and the waiter limits."""
    if isinstance(leases, Elector):
        leases = LeaseSet.single(leases)
    app = web.Application()
    app[LEASES] = leases
    app[SUPERVISOR] = supervisor or leases.supervisor
    app[CHANGES] = ChangeFeed(leases)
    app[LONG_POLLS] = Slots("long-polls", limits.max_long_polls)  # (public: per peer too)
    app[EVENT_STREAMS] = Slots("event streams", limits.max_event_streams)
    app[SCRUB] = scrub
    app.cleanup_ctx.append(_follow_changes)
    return app


async def _follow_changes(app: web.Application) -> AsyncIterator[None]:
    task = app[SUPERVISOR].spawn("change-feed", app[CHANGES].follow)
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _unchanged(text: str) -> str:
    return text


def create_local_app(
    elector: Elector | LeaseSet,
    limits: Limits = DEFAULT_LIMITS,
    scrub: Callable[[str], str] = _unchanged,
    supervisor: Supervisor | None = None,
    *,
    heartbeat: Heartbeat | None = None,
    pod_name: str | None = None,
) -> web.Application:
    """The localhost listener: the app's view, including ``POST /leader/release``.
    ``heartbeat``: stamped at every request (``--app-heartbeat``); never on the public
    listener, which anyone in the cluster can reach."""
    app = _base_app(elector, limits, scrub, supervisor)
    if heartbeat is not None:
        app[HEARTBEAT] = heartbeat
        app.middlewares.append(count_heartbeat)
    app[POD_NAME] = pod_name or ""
    app.router.add_get("/", get_root)
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/leader/{lease:.+}", get_named_leader)
    app.router.add_get("/leases", get_leases)
    app.router.add_get("/events", get_events)
    app.router.add_post("/leader/release", post_release)
    app.router.add_post("/leader/transfer", post_transfer)
    app[RELEASE_REFUSALS] = Throttle()
    return app


def create_public_app(
    elector: Elector | LeaseSet,
    registry: CollectorRegistry,
    health: Callable[[], dict[str, str]],
    limits: Limits = DEFAULT_LIMITS,
    scrub: Callable[[str], str] = _unchanged,
    supervisor: Supervisor | None = None,
) -> web.Application:
    """The public listener: metrics, probes and read-only views of the leases. ``health``:
    what is down now (name → why; empty when healthy), for ``/healthz``."""
    app = _base_app(elector, limits, scrub, supervisor)
    app[HEALTH] = health
    # Reachable from the whole cluster: one address may not hold every long-poll. (Not on
    # localhost, where every client is 127.0.0.1: the app's own processes.)
    app[LONG_POLLS] = Slots(
        "long-polls", limits.max_long_polls, per_peer=limits.max_long_polls_per_peer
    )
    app.router.add_get("/leader", get_leader)
    app.router.add_get("/leader/{lease:.+}", get_named_leader)
    app.router.add_get("/leases", get_leases)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/readyz", get_readyz)
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    return app
