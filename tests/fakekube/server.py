"""The fake Kubernetes API server: aiohttp, one process, plain HTTP on a free port.

It serves what a leader-election sidecar and kubectl use, the way the recorded kube-apiserver
v1.36 does (``recorded/NOTES.md``): Leases in full (get/list/watch/create/replace/patch/
delete), Pods (get/list/create/patch/delete), core/v1 Events (get/list/create/patch),
Namespaces (get/list/create), discovery, ``/version`` and the OpenAPI v3 document kubectl
apply needs. Everything else is a 404, never a made-up answer.

A second listener (the control port) changes the fake itself: faults, dropping watches,
partitions, compaction, the request log. It stays reachable while the API port is partitioned.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import json
import re
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.fakekube import discovery, wire
from tests.fakekube.authz import Authorizer, request_info
from tests.fakekube.faults import Faults
from tests.fakekube.kinds import (
    KINDS,
    Kind,
    LeaseKind,
    generate_name,
    managed_fields,
    new_uid,
    user_agent_manager,
)
from tests.fakekube.patch import json_patch, merge_patch, strategic_merge_patch
from tests.fakekube.state import Change, Cluster, TooOld
from tests.fakekube.wire import LEASES, NAMESPACES, PODS, ApiError, JsonObj
from tests.support.rbac import MASTERS, User

_COMMON_HEADERS = {
    "Cache-Control": "no-cache, private",
    "X-Kubernetes-Pf-Flowschema-Uid": "b15f5e42-e663-4a7e-b1af-90e6f7a5eef6",
    "X-Kubernetes-Pf-Prioritylevel-Uid": "fe923026-5d80-412d-83bf-b19d65e7806a",
}
_UNKNOWN_BODY_FORMAT = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json, application/yaml, application/vnd.kubernetes.protobuf"
)
_PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)
_BOOKMARK_LEAD = 1.5  # a bookmark arrives this long before timeoutSeconds runs out
_BOOKMARK_EVERY = 60.0
_FREEZE_POLL = 0.005


@dataclasses.dataclass(frozen=True)
class Route:
    resource: tuple[str, str, str]
    namespace: str | None
    name: str | None


_RESOURCE_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)
_BY_PATH = {
    ("", "pods"): PODS,
    ("", "events"): KINDS[("", "events", "Event")].resource,
    ("coordination.k8s.io", "leases"): LEASES,
}


def route_of(path: str) -> Route | None:
    match = _RESOURCE_PATH.match(path)
    if not match:
        return None
    resource = _BY_PATH.get((match["group"] or "", match["plural"]))
    if resource is None:
        return None
    return Route(resource, match["ns"], match["name"])


@dataclasses.dataclass(eq=False)
class _Watch:
    transport: asyncio.BaseTransport | None
    dropped: asyncio.Event


class FakeApiServer:
    """The API and control applications around one `Cluster`."""

    def __init__(
        self,
        cluster: Cluster | None = None,
        *,
        user: str = "system:serviceaccount:default:leader-sidecar",
        tokens: set[str] | None = None,
        anonymous: bool = True,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.cluster = cluster or Cluster()
        self.faults = Faults()
        self.user = user
        self.tokens = tokens  # None: any bearer token is this user
        # kubectl (client-go) does not send a bearer token over plain HTTP, so by default the
        # fake authorizes system:anonymous as a cluster with such a RoleBinding would. With
        # anonymous=False it answers 403 as the recorded server does (rbac.json no-token).
        self.anonymous = anonymous
        # RBAC (authz.py): with an Authorizer, tokens name users and Roles decide; user,
        # tokens and anonymous above then play no part.
        self.authorizer = authorizer
        self.requests: list[dict[str, Any]] = []
        # The request log's "t": a test that gives its client a fake clock gives it here too,
        # and counts requests against the time the client believes has passed.
        self.clock: Callable[[], float] = time.monotonic
        self.server_address = "127.0.0.1:0"
        self._watches: set[_Watch] = set()
        self._runner: web.AppRunner | None = None
        self._control_runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self.port = 0
        self.control_port = 0
        self.partitioned = False
        self._held: list[int] = []  # tickets of requests held by a freeze, oldest first
        self._next_ticket = 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0, control_port: int = 0) -> None:
        self._host = host
        self._runner = web.AppRunner(self.api_app(), access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await self._site.start()
        self.port = _bound_port(self._site)
        self.server_address = f"{host}:{self.port}"
        self._control_runner = web.AppRunner(
            self.control_app(), access_log=None, shutdown_timeout=0.1
        )
        await self._control_runner.setup()
        control = web.TCPSite(self._control_runner, host, control_port, reuse_address=True)
        await control.start()
        self.control_port = _bound_port(control)

    async def stop(self) -> None:
        self.drop_watches()
        for runner in (self._runner, self._control_runner):
            if runner is not None:
                await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://{self._host}:{self.control_port}"

    async def partition(self) -> None:
        """Refuse connections: close the listening socket and reset every open connection
        (watches included), as a network partition between the sidecar and the API would."""
        if self.partitioned or self._site is None or self._runner is None:
            return
        self.partitioned = True
        await self._site.stop()
        self.drop_watches()
        server = self._runner.server
        if server is not None:
            for transport in list(server._connections.values()):
                transport.abort()

    async def heal(self) -> None:
        if not self.partitioned or self._runner is None:
            return
        self._site = web.TCPSite(self._runner, self._host, self.port, reuse_address=True)
        await self._site.start()
        self.partitioned = False

    def drop_watches(self) -> int:
        """Cut every open watch stream mid-flight (the client sees the connection reset)."""
        dropped = 0
        for watch in list(self._watches):
            watch.dropped.set()
            if watch.transport is not None:
                watch.transport.abort()
            dropped += 1
        return dropped

    # -- the API application --------------------------------------------------------------

    def api_app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        route = route_of(request.path)
        verb = _verb(request, route)
        entry: dict[str, Any] = {
            "t": self.clock(),
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "verb": verb,
            "resource": route.resource[1] if route else None,
            "namespace": route.namespace if route else None,
            "name": route.name if route else None,
            "content_type": request.headers.get("Content-Type"),
            "accept": request.headers.get("Accept"),
            "user_agent": request.headers.get("User-Agent"),
            "timeout": request.query.get("timeout"),  # the client's ?timeout= (a Go duration)
            "user": None,  # once authenticated (the impersonated user, if any)
            "status": None,
        }
        self.requests.append(entry)
        del self.requests[:-20000]
        try:
            response = await self._serve(request, route, verb, entry)
        except ApiError as error:
            response = self._status_response(request, error)
        entry["status"] = response.status
        entry["seconds"] = round(time.monotonic() - started, 4)
        return response

    async def _serve(
        self, request: web.Request, route: Route | None, verb: str, entry: dict[str, Any]
    ) -> web.StreamResponse:
        resource = route.resource[1] if route else ""
        name = (route.name or "") if route else ""
        if verb in ("list", "watch"):
            # As the real RequestInfo does: a list/watch selecting one name by field selector
            # is authorized (and RBAC resourceNames apply) as a request for that name.
            selected = re.fullmatch(
                r"metadata\.name==?([^,]+)", request.query.get("fieldSelector", "")
            )
            name = selected[1] if selected else ""
        redirect = self.faults.redirect_for(verb, resource, name)
        if redirect is not None:
            target = redirect.location.rstrip("/") + request.path_qs
            return web.Response(status=redirect.status, headers=self._headers({"Location": target}))
        delay = self.faults.delay_for(verb, resource, name)
        if delay:
            await asyncio.sleep(delay)
        # A frozen server holds the request until the faults change (they are replaced
        # wholesale, also by direct assignment in-process, hence a short poll rather than an
        # event); the held requests then proceed in arrival order. aiohttp does not cancel a
        # handler whose client went away, so a held write is applied even after the client
        # gave up, as a real server does.
        late = 0.0
        if self.faults.frozen(verb, resource, name) or (
            late := self.faults.late_for(verb, resource, name)
        ):
            await request.read()  # the server has the body before it stalls (cached)
        if self.faults.frozen(verb, resource, name):
            await self._hold_while_frozen(verb, resource, name)
        if late:
            entry["late"] = late
            await asyncio.sleep(late)
        user = self._impersonate(request, self._authenticate(request), entry)
        entry["user"] = user.name
        throttled = self.faults.error_for(verb, resource, name, throttle=True)
        if throttled is not None:
            raise wire.throttled(throttled.retry_after)
        if self.authorizer is not None:
            self._authorize(request, user, entry)
        if route is None:
            return await self._serve_other(request)
        anonymous_refused = (
            self.authorizer is None and user.name == "system:anonymous" and not self.anonymous
        )
        if anonymous_refused or self.faults.forbidden(verb, resource, name):
            raise wire.forbidden(route.resource, name, user.name, verb, route.namespace)
        injected = self.faults.error_for(verb, resource, name, throttle=False)
        if injected is not None:
            raise self._injected(injected.status, route, injected.retry_after)
        if self.faults.ends_watch(verb, resource, name):
            return await self._empty_watch(request)
        if self.faults.expires_watch(verb, resource, name) and request.query.get(
            "resourceVersion", ""
        ) not in ("", "0"):
            return await self._expired_watch(request)
        return await self._serve_resource(request, route, verb)

    async def _empty_watch(self, request: web.Request) -> web.StreamResponse:
        """A watch answered ``200`` and ended at once, no event: what a proxy or load
        balancer that closes long streams sends."""
        response = web.StreamResponse(
            status=200, headers=self._headers({"Content-Type": "application/json"})
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write_eof()
        return response

    async def _expired_watch(self, request: web.Request) -> web.StreamResponse:
        """A watch answered ``200`` and ended at once with the ``410 Expired`` ``ERROR`` event,
        as the real server answers a resourceVersion older than its history."""
        response = web.StreamResponse(
            status=200, headers=self._headers({"Content-Type": "application/json"})
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        version = request.query.get("resourceVersion", "")
        message = f"too old resource version: {version} ({self.cluster.rv})"
        await response.write(wire.dumps({"type": "ERROR", "object": wire.expired(message)}))
        await response.write_eof()
        return response

    def _impersonate(self, request: web.Request, user: User, entry: dict[str, Any]) -> User:
        """The ``Impersonate-*`` headers, as kube-apiserver's impersonation filter applies them
        after authentication: the request then acts as that user, with those groups (and
        ``system:authenticated``). Without RBAC anyone may impersonate; with it, only
        ``system:masters`` (the fake has no ClusterRoles to grant ``impersonate``), everyone
        else gets the real 403."""
        acting = request.headers.get("Impersonate-User")
        groups = request.headers.getall("Impersonate-Group", [])
        uid = request.headers.get("Impersonate-Uid")
        extra = {
            key[len("Impersonate-Extra-") :].lower(): request.headers.getall(key)
            for key in request.headers
            if key.lower().startswith("impersonate-extra-")
        }
        if acting is None:
            if groups or uid or extra:
                raise wire.internal_error(
                    "requested impersonation of uid, groups or user-extra without "
                    "impersonating a user"
                )
            return user
        if self.authorizer is not None and MASTERS not in user.groups:
            raise wire.forbidden(("", "users", ""), acting, user.name, "impersonate", None)
        entry["impersonated_by"] = user.name
        entry["impersonation"] = {"user": acting, "groups": groups, "uid": uid, "extra": extra}
        return User.authenticated(acting, groups)

    async def _hold_while_frozen(self, verb: str, resource: str, name: str) -> None:
        """Wait until the freeze is lifted, then go in arrival order: the oldest held request
        first (a ticket queue; a request whose handler is cancelled leaves it)."""
        ticket = self._next_ticket
        self._next_ticket += 1
        self._held.append(ticket)
        try:
            while self.faults.frozen(verb, resource, name) or self._held[0] != ticket:  # noqa: ASYNC110
                await asyncio.sleep(_FREEZE_POLL)
        finally:
            self._held.remove(ticket)

    def _authenticate(self, request: web.Request) -> User:
        header = request.headers.get("Authorization", "")
        if not header:
            return User.anonymous()
        token = header.partition(" ")[2].strip()
        unauthorized = ApiError(401, wire.status(401, "Unauthorized", "Unauthorized"))
        if self.authorizer is not None:
            user = self.authorizer.authenticate(token)
            if user is None:
                raise unauthorized
            return user
        if self.tokens is not None and token not in self.tokens:
            raise unauthorized
        return User.authenticated(self.user)

    def _authorize(self, request: web.Request, user: User, entry: dict[str, Any]) -> None:
        """RBAC, before anything is looked up (so a missing object is a 403 too). Logs what
        RBAC saw and decided in the request log entry."""
        assert self.authorizer is not None
        attributes = request_info(request.method, request.path, request.query)
        if attributes is None:
            return  # discovery, /version, /healthz, /openapi: open to everyone
        decision = self.authorizer.authorize(user, attributes)
        entry["rbac"] = {
            "verb": attributes.verb,
            "group": attributes.group,
            "resource": attributes.combined_resource,
            "namespace": attributes.namespace,
            "name": attributes.name,
            "allowed": decision.allowed,
            "reason": decision.reason,
        }
        if not decision.allowed:
            raise wire.forbidden(
                (attributes.group, attributes.resource, ""),
                attributes.name,
                user.name,
                attributes.verb,
                attributes.namespace or None,
                subresource=attributes.subresource,
                reason=decision.reason,
            )

    def _injected(self, code: int, route: Route, retry_after: int | None = None) -> ApiError:
        error = self._injected_status(code, route)
        if retry_after is not None:
            error.headers["Retry-After"] = str(retry_after)
        return error

    def _injected_status(self, code: int, route: Route) -> ApiError:
        if code == 409:
            return wire.conflict(route.resource, route.name or "")
        if code == 504:
            return ApiError(
                504,
                wire.status(
                    504,
                    "Timeout",
                    "the server was unable to return a response in the time allotted, but may "
                    "still be processing the request",
                    {},
                ),
            )
        if code == 503:
            return ApiError(
                503,
                wire.status(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                    {},
                ),
            )
        return wire.internal_error("Internal error occurred: injected by the fake API server")

    # -- responses ------------------------------------------------------------------------

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Audit-Id": str(uuid.uuid4()), **_COMMON_HEADERS}
        if extra:
            headers.update(extra)
        return headers

    def _pretty(self, request: web.Request) -> bool:
        agent = request.headers.get("User-Agent", "")
        return request.query.get("pretty") == "true" or agent.startswith(
            ("curl", "Wget", "Mozilla/5.0")
        )

    def _json(
        self,
        request: web.Request,
        body: Any,
        status: int = 200,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> web.Response:
        accept = _accepts(request)
        if content_type == "application/json" and _wants_yaml(accept):
            payload = yaml.safe_dump(body, default_flow_style=False, sort_keys=True).encode()
            content_type = "application/yaml"
        else:
            payload = wire.dumps(body, self._pretty(request))
        all_headers = self._headers(headers)
        all_headers["Content-Type"] = content_type
        return web.Response(body=payload, status=status, headers=all_headers)

    def _status_response(self, request: web.Request, error: ApiError) -> web.Response:
        headers = self._headers(error.headers)
        if error.code == 401:
            for key in ("X-Kubernetes-Pf-Flowschema-Uid", "X-Kubernetes-Pf-Prioritylevel-Uid"):
                headers.pop(key, None)
        if error.text is not None:
            headers["Content-Type"] = "text/plain; charset=utf-8"
            return web.Response(text=error.text, status=error.code, headers=headers)
        headers["Content-Type"] = "application/json"
        return web.Response(
            body=wire.dumps(error.body, self._pretty(request)), status=error.code, headers=headers
        )

    # -- discovery, version, health, OpenAPI ----------------------------------------------

    async def _serve_other(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if request.method != "GET":
            raise ApiError(
                405,
                wire.status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    {},
                ),
            )
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(
                text="ok",
                headers=self._headers(
                    {
                        "Content-Type": "text/plain; charset=utf-8",
                        "X-Content-Type-Options": "nosniff",
                    }
                ),
            )
        if path == "/version":
            return self._json(request, discovery.version())
        if path == "/api":
            if _wants_aggregated(request):
                return self._aggregated(request, discovery.api_aggregated())
            return self._json(request, discovery.api_versions(self.server_address))
        if path == "/apis":
            if _wants_aggregated(request):
                return self._aggregated(request, discovery.apis_aggregated())
            return self._json(request, discovery.apis_legacy())
        if path == "/api/v1":
            return self._json(request, discovery.core_v1_resources())
        match = re.fullmatch(r"/apis/([^/]+)(?:/([^/]+))?", path)
        if match:
            body = (
                discovery.group_version(f"{match[1]}/{match[2]}")
                if match[2]
                else discovery.group(match[1])
            )
            if body is not None:
                return self._json(request, body)
        if path == "/openapi/v3":
            return self._json(
                request,
                discovery.openapi_root(),
                headers={"Accept-Ranges": "bytes"},
                content_type="text/plain; charset=utf-8",
            )
        if path == "/openapi/v3/" + discovery.COORDINATION_OPENAPI:
            payload = discovery.openapi_coordination()
            headers = self._headers(
                {
                    "Content-Type": "application/json",
                    "Accept-Ranges": "bytes",
                    "Etag": f'"{discovery.openapi_hash()}"',
                    "Vary": "Accept",
                }
            )
            if request.query.get("hash"):
                headers["Cache-Control"] = "public, immutable"
            return web.Response(body=payload, headers=headers)
        namespace = re.fullmatch(r"/api/v1/namespaces(?:/([^/]+))?", path)
        if namespace:
            return self._namespaces(request, namespace[1])
        raise wire.path_not_found()

    def _aggregated(self, request: web.Request, body: Any) -> web.Response:
        payload = wire.dumps(body)
        tag = discovery.etag(payload)
        headers = self._headers(
            {
                "Cache-Control": "public",
                "Content-Type": discovery.AGGREGATED_CONTENT_TYPE,
                "Etag": tag,
                "Vary": "Accept",
            }
        )
        if request.headers.get("If-None-Match") == tag:
            del headers["Content-Type"]
            return web.Response(status=304, headers=headers)
        return web.Response(body=payload, headers=headers)

    def _namespace_object(self, name: str) -> JsonObj:
        return {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"namespace/{name}")),
                "resourceVersion": "1",
                "creationTimestamp": "2026-11-29T09:00:00Z",
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _namespaces(self, request: web.Request, name: str | None) -> web.Response:
        if name is not None:
            if name not in self.cluster.namespaces:
                raise wire.not_found(NAMESPACES, name)
            return self._json(request, self._namespace_object(name))
        items = []
        for ns in sorted(self.cluster.namespaces):
            item = self._namespace_object(ns)
            del item["kind"], item["apiVersion"]
            items.append(item)
        return self._json(
            request,
            {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.cluster.rv)},
                "items": items,
            },
        )

    # -- resources --------------------------------------------------------------------------

    async def _serve_resource(
        self, request: web.Request, route: Route, verb: str
    ) -> web.StreamResponse:
        kind = KINDS[route.resource]
        if (
            verb == "create"
            and route.namespace is not None
            and route.namespace not in self.cluster.namespaces
        ):
            raise wire.not_found(NAMESPACES, route.namespace)
        if verb == "watch":
            return await self._watch(request, kind, route)
        if verb == "list":
            return self._list(request, kind, route)
        _check_acceptable(request)
        if verb == "get":
            obj = self._existing(kind, route)
            if _wants_table(request) and isinstance(kind, LeaseKind):
                return self._json(request, self._lease_table([obj], request))
            return self._json(request, kind.output(obj))
        if verb == "create":
            return await self._create(request, kind, route)
        if verb == "update":
            return await self._replace(request, kind, route)
        if verb == "patch":
            return await self._patch(request, kind, route)
        if verb == "delete":
            return await self._delete(request, kind, route)
        raise ApiError(
            405,
            wire.status(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                {},
            ),
        )

    def _existing(self, kind: Kind, route: Route) -> JsonObj:
        obj = self.cluster.get(route.resource, route.namespace or "", route.name or "")
        if obj is None:
            raise wire.not_found(route.resource, route.name or "")
        return obj

    async def _read_body(self, request: web.Request, kind: Kind) -> Any:
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0]
        raw = await request.text()
        if content_type in ("application/json", ""):
            try:
                return json.loads(raw)
            except json.JSONDecodeError as exc:
                snippet = raw[:30] + (" ..." if len(raw) > 30 else "")
                problem = (
                    "unexpected end of JSON input"
                    if exc.pos >= len(raw.rstrip())
                    else f"invalid character {raw[exc.pos]!r} looking for beginning of value"
                )
                raise wire.bad_request(
                    f"the object provided is unrecognized (must be of type {kind.kind}): "
                    f"couldn't get version/kind; json parse error: {problem} ({snippet})"
                ) from None
        if content_type == "application/yaml":
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise wire.bad_request(f"error converting YAML to JSON: {exc}") from None
        raise wire.unsupported_media_type(_UNKNOWN_BODY_FORMAT)

    def _decode(self, request: web.Request, kind: Kind, body: Any) -> tuple[JsonObj, list[str]]:
        strict = request.query.get("fieldValidation") == "Strict"
        return kind.decode(body, strict=strict)

    def _warnings(self, warnings: list[str]) -> dict[str, str]:
        if not warnings:
            return {}
        return {"Warning": ", ".join(f"299 - {json.dumps(text)}" for text in warnings)}

    def _manager(self, request: web.Request) -> str:
        return request.query.get("fieldManager") or user_agent_manager(
            request.headers.get("User-Agent")
        )

    async def _create(self, request: web.Request, kind: Kind, route: Route) -> web.Response:
        if route.name:
            raise ApiError(
                405,
                wire.status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                    {},
                ),
            )
        namespace = route.namespace or ""
        body = await self._read_body(request, kind)
        obj, warnings = self._decode(request, kind, body)
        meta = obj["metadata"]
        if meta.get("namespace") not in (None, "", namespace):
            raise wire.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(str(meta["generateName"]))
        kind.validate(obj, None)
        name = str(meta["name"])
        if self.cluster.get(route.resource, namespace, name) is not None:
            raise wire.already_exists(route.resource, name)
        stored = self._insert(request, kind, obj, namespace, body)
        return self._json(request, kind.output(stored), 201, self._warnings(warnings))

    def _insert(
        self, request: web.Request, kind: Kind, obj: JsonObj, namespace: str, body: Any
    ) -> JsonObj:
        now = wire.now()
        meta = obj["metadata"]
        meta["namespace"] = namespace
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = wire.format_time(now)
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        kind.on_create(obj, now)
        meta["managedFields"] = managed_fields(
            [],
            self._manager(request),
            kind.api_version,
            body if isinstance(body, dict) else {},
            now,
        )
        stored, _ = self.cluster.store(kind.resource, namespace, str(meta["name"]), obj)
        return stored

    async def _replace(self, request: web.Request, kind: Kind, route: Route) -> web.Response:
        namespace, name = route.namespace or "", route.name or ""
        body = await self._read_body(request, kind)
        obj, warnings = self._decode(request, kind, body)
        meta = obj["metadata"]
        if meta.get("name", name) != name:
            raise wire.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if meta.get("namespace") not in (None, "", namespace):
            raise wire.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta["name"] = name
        old = self.cluster.get(kind.resource, namespace, name)
        if old is None:
            if not isinstance(kind, LeaseKind):
                raise wire.not_found(kind.resource, name)
            # Leases allow create-on-update: a PUT to a missing name creates it, whatever
            # resourceVersion the body carries (recorded: put-missing-with-rv).
            if namespace not in self.cluster.namespaces:
                raise wire.not_found(NAMESPACES, namespace)
            # ...but not with a uid: the API server checks a PUT's uid as a precondition
            # against the stored object, here an empty one (registry Store.Update ->
            # GuaranteedUpdate -> Preconditions.Check), and answers 409. Not in the recorded
            # transcripts; from the API server's source.
            if meta.get("uid"):
                raise ApiError(
                    409,
                    wire.status(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on {kind.resource[1]}.{kind.resource[0]} "
                        f'"{name}": Precondition failed: UID in precondition: {meta["uid"]}, '
                        "UID in object meta: ",
                        {"name": name, "kind": kind.resource[1]},
                    ),
                )
            kind.validate(obj, None)
            stored = self._insert(request, kind, obj, namespace, body)
            return self._json(request, kind.output(stored), 201, self._warnings(warnings))
        if not meta.get("resourceVersion"):
            raise wire.invalid(
                kind.resource,
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "Invalid value: 0: must be specified for an update",
                        "FieldValueInvalid",
                    )
                ],
                plural_ref=True,
            )
        if meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise wire.conflict(kind.resource, name)
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise ApiError(
                409,
                wire.status(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                    f"{old['metadata']['uid']}",
                    {"name": name, "kind": kind.resource[1]},
                ),
            )
        stored = self._update(request, kind, obj, old, body)
        return self._json(request, kind.output(stored), 200, self._warnings(warnings))

    def _update(
        self, request: web.Request, kind: Kind, obj: JsonObj, old: JsonObj, body: Any
    ) -> JsonObj:
        meta = obj["metadata"]
        for field in ("uid", "creationTimestamp", "namespace", "name"):
            meta[field] = old["metadata"][field]
        kind.on_update(obj, old)
        kind.validate(obj, old)
        meta["managedFields"] = managed_fields(
            old["metadata"].get("managedFields", []),
            self._manager(request),
            kind.api_version,
            body if isinstance(body, dict) else {},
            wire.now(),
        )
        stored, _ = self.cluster.store(
            kind.resource, str(meta["namespace"]), str(meta["name"]), obj
        )
        return stored

    async def _patch(self, request: web.Request, kind: Kind, route: Route) -> web.Response:
        name = route.name or ""
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == "application/apply-patch+yaml":
            raise wire.unsupported_media_type(
                "the fake API server does not implement server-side apply "
                "(application/apply-patch+yaml)"
            )
        if content_type not in _PATCH_TYPES:
            raise wire.unsupported_media_type()
        raw = await request.text()
        try:
            patch = json.loads(raw)
        except json.JSONDecodeError:
            raise wire.bad_request("error decoding patch: unexpected end of JSON input") from None
        old = self._existing(kind, route)
        current = kind.output(old)
        if content_type == "application/json-patch+json":
            patched = json_patch(current, patch)
        elif content_type == "application/strategic-merge-patch+json":
            patched = strategic_merge_patch(current, patch)
        else:
            patched = merge_patch(current, patch)
        if not isinstance(patched, dict):
            raise wire.generic_invalid()
        wanted_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != old["metadata"]["resourceVersion"]:
            raise wire.conflict(kind.resource, name)
        wanted_uid = (patched.get("metadata") or {}).get("uid")
        if wanted_uid and wanted_uid != old["metadata"]["uid"]:
            # The real server: ValidateObjectMetaUpdate, uid is immutable (422, not 409).
            raise wire.invalid(
                kind.resource,
                name,
                [
                    (
                        "metadata.uid",
                        f'Invalid value: "{wanted_uid}": field is immutable',
                        "FieldValueInvalid",
                    )
                ],
                plural_ref=True,
            )
        try:
            obj, _ = kind.decode(patched, strict=False)
        except ApiError as exc:
            reason = exc.body.get("message", "").split(": ", 1)[-1]
            document = json.dumps(patched, separators=(",", ":"), sort_keys=True)
            raise ApiError(
                422,
                wire.status(
                    422,
                    "Invalid",
                    f' "" is invalid: patch: Invalid value: {json.dumps(document)}: {reason}',
                    {
                        "causes": [
                            {
                                "reason": "FieldValueInvalid",
                                "message": f"Invalid value: {json.dumps(document)}: {reason}",
                                "field": "patch",
                            }
                        ]
                    },
                ),
            ) from None
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        managed_body = patch if isinstance(patch, dict) else {}
        stored = self._update(request, kind, obj, old, managed_body)
        return self._json(request, kind.output(stored))

    async def _delete(self, request: web.Request, kind: Kind, route: Route) -> web.Response:
        namespace, name = route.namespace or "", route.name or ""
        options: Any = {}
        if request.can_read_body:
            raw = await request.text()
            if raw.strip():
                try:
                    options = json.loads(raw)
                except json.JSONDecodeError:
                    raise wire.bad_request("error decoding DeleteOptions") from None
        old = self._existing(kind, route)
        preconditions = (options or {}).get("preconditions") or {}
        for field, actual in (
            ("resourceVersion", old["metadata"]["resourceVersion"]),
            ("uid", old["metadata"]["uid"]),
        ):
            wanted = preconditions.get(field)
            if wanted is not None and wanted != actual:
                raise wire.precondition_conflict(kind.resource, name, field, wanted, actual)
        if kind.resource == PODS:
            # Unscheduled pods go at once; the answer is the Pod, not a Status.
            last = copy.deepcopy(old)
            last["metadata"]["deletionTimestamp"] = wire.format_time(wire.now())
            last["metadata"]["deletionGracePeriodSeconds"] = 0
            last["metadata"]["generation"] = int(last["metadata"].get("generation", 1)) + 1
            self.cluster.store(kind.resource, namespace, name, last)
            gone = self.cluster.delete(kind.resource, namespace, name)
            return self._json(request, kind.output(gone))
        self.cluster.delete(kind.resource, namespace, name)
        group, plural, _ = kind.resource
        details: JsonObj = {"name": name}
        if group:
            details["group"] = group
        details.update({"kind": plural, "uid": old["metadata"]["uid"]})
        return self._json(
            request,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            },
        )

    # -- list and watch ---------------------------------------------------------------------

    def _selectors(self, request: web.Request, kind: Kind) -> Callable[[JsonObj], bool]:
        fields = _parse_field_selector(request.query.get("fieldSelector", ""), kind)
        labels = _parse_label_selector(request.query.get("labelSelector", ""))

        def selected(obj: JsonObj) -> bool:
            for field, op, value in fields:
                actual = kind.field_value(obj, field) or ""
                if (actual == value) != (op == "="):
                    return False
            obj_labels = obj["metadata"].get("labels") or {}
            return all(rule(obj_labels) for rule in labels)

        return selected

    def _list(self, request: web.Request, kind: Kind, route: Route) -> web.Response:
        selected = self._selectors(request, kind)
        items = [obj for obj in self.cluster.list(kind.resource, route.namespace) if selected(obj)]
        metadata: JsonObj = {"resourceVersion": str(self.cluster.rv)}
        start = 0
        if request.query.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(request.query["continue"]))
                start, metadata["resourceVersion"] = int(token["start"]), str(token["rv"])
            except (ValueError, KeyError):
                raise wire.bad_request("continue key is not valid") from None
        limit = int(request.query.get("limit") or 0)
        page = items[start:]
        if limit and len(page) > limit:
            page = page[:limit]
            token = {"start": start + limit, "rv": metadata["resourceVersion"]}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            metadata["remainingItemCount"] = len(items) - start - limit
        if _wants_table(request) and isinstance(kind, LeaseKind):
            table = self._lease_table(page, request)
            table["metadata"] = metadata
            return self._json(request, table)
        _check_acceptable(request)
        body = {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": metadata,
            "items": [],
        }
        for obj in page:
            item = kind.output(obj)
            del item["kind"], item["apiVersion"]
            body["items"].append(item)
        return self._json(request, body)

    def _lease_table(
        self, leases: list[JsonObj], request: web.Request, *, columns: bool = True
    ) -> JsonObj:
        kind = KINDS[LEASES]
        now = wire.now()
        include = request.query.get("includeObject", "Metadata")
        rows = []
        for lease in leases:
            created = wire.parse_time(lease["metadata"]["creationTimestamp"])
            if include == "Object":
                obj: Any = kind.output(lease)
            elif include == "None":
                obj = None
            else:
                obj = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": wire.ordered_metadata(lease["metadata"]),
                }
            row: JsonObj = {
                "cells": [
                    lease["metadata"]["name"],
                    lease.get("spec", {}).get("holderIdentity", ""),
                    wire.human_duration(now - created),
                ]
            }
            if obj is not None:
                row["object"] = obj
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.cluster.rv)},
            "columnDefinitions": discovery.lease_table_columns() if columns else None,
            "rows": rows,
        }

    async def _watch(self, request: web.Request, kind: Kind, route: Route) -> web.StreamResponse:
        query = request.query
        selected = self._selectors(request, kind)
        rv_text = query.get("resourceVersion", "")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        send_initial = query.get("sendInitialEvents") == "true"
        rv_match = query.get("resourceVersionMatch")
        table = _wants_table(request) and isinstance(kind, LeaseKind)
        if send_initial and rv_match != "NotOlderThan":
            problems = [
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
                "resourceVersionMatch to NotOlderThan"
            ]
            if rv_match:
                problems.append(
                    f'resourceVersionMatch: Unsupported value: "{rv_match}": supported values: '
                    '"NotOlderThan"'
                )
            summary = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
            raise ApiError(
                422,
                wire.status(
                    422,
                    "Invalid",
                    f'ListOptions.meta.k8s.io "" is invalid: {summary}',
                    {
                        "group": "meta.k8s.io",
                        "kind": "ListOptions",
                        "causes": [
                            {
                                "reason": "FieldValueForbidden"
                                if "Forbidden" in problem
                                else "FieldValueNotSupported",
                                "message": problem.split(": ", 1)[1],
                                "field": "resourceVersionMatch",
                            }
                            for problem in problems
                        ],
                    },
                ),
            )
        start_rv: int | None = None
        if rv_text not in ("", "0"):
            try:
                start_rv = int(rv_text)
                if start_rv < 0:
                    raise ValueError
            except ValueError:
                raise ApiError(
                    500,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f'resourceVersion: Invalid value: "{rv_text}": '
                        f'strconv.ParseUint: parsing "{rv_text}": invalid syntax',
                        "code": 500,
                    },
                ) from None
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None

        queue = self.cluster.subscribe()
        watch = _Watch(request.transport, asyncio.Event())
        self._watches.add(watch)
        response = web.StreamResponse(
            status=200, headers=self._headers({"Content-Type": "application/json"})
        )
        response.enable_chunked_encoding()
        first_table = [True]

        def event_line(change_type: str, obj: JsonObj) -> bytes:
            if table:
                body = self._lease_table([obj], request, columns=first_table[0])
                body["metadata"] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                first_table[0] = False
                return wire.dumps({"type": change_type, "object": body})
            return wire.dumps({"type": change_type, "object": kind.output(obj)})

        bookmarked: list[int] = []

        def bookmark(initial_end: bool = False) -> bytes:
            bookmarked.append(self.cluster.rv)
            metadata: JsonObj = {"resourceVersion": str(self.cluster.rv)}
            if initial_end:
                metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
            body: JsonObj = {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": metadata,
            }
            if isinstance(kind, LeaseKind):
                body["spec"] = {}
            return wire.dumps({"type": "BOOKMARK", "object": body})

        def wanted(change: Change) -> bool:
            return (
                change.resource == kind.resource
                and (route.namespace is None or change.namespace == route.namespace)
                and selected(change.obj)
            )

        try:
            await response.prepare(request)
            snapshot_rv = self.cluster.rv
            if start_rv is None or send_initial:
                for obj in self.cluster.list(kind.resource, route.namespace):
                    if selected(obj):
                        await response.write(event_line("ADDED", obj))
                if bookmarks and not table:
                    await response.write(bookmark(initial_end=True))
            if start_rv is not None and not send_initial:
                try:
                    backlog = [c for c in self.cluster.changes_since(start_rv) if wanted(c)]
                except TooOld as exc:
                    error = {"type": "ERROR", "object": wire.expired(str(exc))}
                    await response.write(wire.dumps(error))
                    await response.write_eof()
                    return response
                for change in backlog:
                    if change.rv <= snapshot_rv:
                        await response.write(event_line(change.type, change.obj))
            next_bookmark = _next_bookmark(bookmarks and not table, deadline)
            while not watch.dropped.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    await response.write_eof()
                    return response
                if next_bookmark is not None and now >= next_bookmark:
                    # As recorded, a bookmark repeating the last bookmark's RV is not sent.
                    if not bookmarked or bookmarked[-1] != self.cluster.rv:
                        await response.write(bookmark())
                    next_bookmark = now + _BOOKMARK_EVERY
                wake = min(t for t in (deadline, next_bookmark, now + 1.0) if t is not None)
                try:
                    async with asyncio.timeout(max(0.0, wake - now)):
                        change = await queue.get()
                except TimeoutError:
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        return response
                    continue
                if change.rv > snapshot_rv and wanted(change):
                    await response.write(event_line(change.type, change.obj))
            return response
        except (ConnectionResetError, ConnectionError, RuntimeError):
            return response
        finally:
            self.cluster.unsubscribe(queue)
            self._watches.discard(watch)

    # -- the control application ------------------------------------------------------------

    def control_app(self) -> web.Application:
        app = web.Application()
        routes = [
            web.get("/_fake/faults", self._get_faults),
            web.put("/_fake/faults", self._put_faults),
            web.delete("/_fake/faults", self._clear_faults),
            web.get("/_fake/rbac", self._get_rbac),
            web.put("/_fake/rbac", self._put_rbac),
            web.delete("/_fake/rbac", self._clear_rbac),
            web.post("/_fake/drop-watches", self._drop_watches),
            web.post("/_fake/partition", self._partition),
            web.post("/_fake/heal", self._heal),
            web.post("/_fake/compact", self._compact),
            web.get("/_fake/requests", self._get_requests),
            web.delete("/_fake/requests", self._clear_requests),
            web.post("/_fake/namespaces", self._add_namespace),
            web.get("/_fake/state", self._state),
        ]
        app.add_routes(routes)
        return app

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.describe())

    async def _put_faults(self, request: web.Request) -> web.Response:
        try:
            self.faults = Faults.parse(await request.json())
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.faults.describe())

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.faults = Faults()
        return web.json_response(self.faults.describe())

    def _describe_rbac(self) -> dict[str, Any]:
        return self.authorizer.describe() if self.authorizer else {"enabled": False}

    async def _get_rbac(self, request: web.Request) -> web.Response:
        return web.json_response(self._describe_rbac())

    async def _put_rbac(self, request: web.Request) -> web.Response:
        try:
            self.authorizer = Authorizer.parse(await request.json())
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self._describe_rbac())

    async def _clear_rbac(self, request: web.Request) -> web.Response:
        self.authorizer = None
        return web.json_response(self._describe_rbac())

    async def _drop_watches(self, request: web.Request) -> web.Response:
        return web.json_response({"dropped": self.drop_watches()})

    async def _partition(self, request: web.Request) -> web.Response:
        await self.partition()
        return web.json_response({"partitioned": True})

    async def _heal(self, request: web.Request) -> web.Response:
        await self.heal()
        return web.json_response({"partitioned": False})

    async def _compact(self, request: web.Request) -> web.Response:
        return web.json_response({"floor": self.cluster.compact()})

    async def _get_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def _clear_requests(self, request: web.Request) -> web.Response:
        self.requests.clear()
        return web.json_response({"cleared": True})

    async def _add_namespace(self, request: web.Request) -> web.Response:
        name = (await request.json())["name"]
        self.cluster.namespaces.add(name)
        return web.json_response({"name": name})

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "resourceVersion": self.cluster.rv,
                "floor": self.cluster.floor,
                "watches": len(self._watches),
                "partitioned": self.partitioned,
            }
        )


# -- request helpers --------------------------------------------------------------------------


def _bound_port(site: web.TCPSite) -> int:
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1])


def _verb(request: web.Request, route: Route | None) -> str:
    method = request.method
    if method == "GET":
        if route is None or route.name:
            return "get"
        return "watch" if request.query.get("watch") in ("true", "1") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _accepts(request: web.Request) -> list[tuple[str, dict[str, str]]]:
    header = request.headers.get("Accept", "") or "*/*"
    ranges = []
    for part in header.split(","):
        pieces = [piece.strip() for piece in part.split(";")]
        params = dict(piece.split("=", 1) for piece in pieces[1:] if "=" in piece)
        ranges.append((pieces[0].lower(), params))
    return ranges


def _wants_as(request: web.Request, kind: str, group: str, versions: tuple[str, ...]) -> bool:
    """Whether the client's first acceptable JSON form is ``application/json;as=<kind>``
    (a Table, an aggregated discovery list) rather than the plain object."""
    for media, params in _accepts(request):
        if media == "application/json" and params.get("as") == kind:
            return params.get("g") == group and params.get("v") in versions
        if media in ("application/json", "*/*", "application/*"):
            return False
    return False


def _wants_table(request: web.Request) -> bool:
    return _wants_as(request, "Table", "meta.k8s.io", ("v1", "v1beta1"))


def _wants_aggregated(request: web.Request) -> bool:
    return _wants_as(request, "APIGroupDiscoveryList", "apidiscovery.k8s.io", ("v2", "v2beta1"))


def _wants_yaml(accept: list[tuple[str, dict[str, str]]]) -> bool:
    for media, _ in accept:
        if media == "application/yaml":
            return True
        if media in ("application/json", "*/*", "application/*"):
            return False
    return False


def _check_acceptable(request: web.Request) -> None:
    for media, _ in _accepts(request):
        if media in (
            "application/json",
            "application/yaml",
            "*/*",
            "application/*",
            "application/vnd.kubernetes.protobuf",
        ):
            return
    raise wire.not_acceptable()


def _next_bookmark(enabled: bool, deadline: float | None) -> float | None:
    if not enabled:
        return None
    now = time.monotonic()
    if deadline is not None:
        return max(now + 0.2, deadline - _BOOKMARK_LEAD)
    return now + _BOOKMARK_EVERY


def _parse_field_selector(text: str, kind: Kind) -> list[tuple[str, str, str]]:
    rules = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        match = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", part)
        if not match:
            raise wire.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = match[1].strip(), match[2], match[3].strip()
        if field not in kind.field_selectors:
            known = ", ".join(f'"{name}"' for name in kind.field_selectors)
            raise wire.bad_request(f'"{field}" is not a known field selector: only {known}')
        rules.append((field, "!=" if op == "!=" else "=", value))
    return rules


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _parse_label_selector(text: str) -> list[Callable[[dict[str, str]], bool]]:
    rules: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text):
        set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if set_match:
            key, op = set_match[1], set_match[2]
            values = {value.strip() for value in set_match[3].split(",")}
            if op == "in":
                rules.append(lambda labels, k=key, v=values: labels.get(k) in v)
            else:
                rules.append(lambda labels, k=key, v=values: labels.get(k) not in v)
            continue
        eq_match = re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", part)
        if eq_match:
            key, op, value = eq_match[1], eq_match[2], eq_match[3]
            if op == "!=":
                rules.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                rules.append(lambda labels, k=key, v=value: labels.get(k) == v)
            continue
        if part.startswith("!"):
            absent = part[1:].strip()
            rules.append(lambda labels, k=absent: k not in labels)
        else:
            rules.append(lambda labels, k=part: k in labels)
    return rules


def kubeconfig(server_url: str, namespace: str = "default", token: str = "fake-token") -> str:
    """A kubeconfig that points kubectl and the Python client at the fake."""
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: fake\n"
        "  cluster:\n"
        f"    server: {server_url}\n"
        "contexts:\n"
        "- name: fake\n"
        "  context:\n"
        "    cluster: fake\n"
        "    user: fake\n"
        f"    namespace: {namespace}\n"
        "current-context: fake\n"
        "users:\n"
        "- name: fake\n"
        "  user:\n"
        f"    token: {token}\n"
    )


def write_kubeconfig(path: Path, server_url: str, namespace: str = "default") -> Path:
    path.write_text(kubeconfig(server_url, namespace))
    return path


def parse_query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


@contextlib.asynccontextmanager
async def running(**kwargs: Any):  # type: ignore[no-untyped-def]
    """``async with running() as fake:`` — an in-process fake on free ports."""
    fake = FakeApiServer(**kwargs)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()
