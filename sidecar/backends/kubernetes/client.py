"""A small REST client of the Kubernetes API over aiohttp, set up the way a lease needs it.

Why not the official client: importing ``kubernetes.aio.client`` costs ~58 MiB of RSS and
~0.9 s (its package imports every API and ~700 models), which is most of the sidecar's memory
and start time. A lease needs a handful of JSON requests and one streaming GET; this module
sends plain dicts and gets plain dicts back (docs/design.md, "The Kubernetes client").

* One `KubeApi` per process, shared by the lease store and the demotion actions, configured on
  first use (`sidecar.backends.kubernetes.kubeconfig`): the pod's service account in a cluster,
  else a kubeconfig. One aiohttp session: an HTTP/1.1 keep-alive pool of 100 connections.
* No retries here: a retried PUT would be a blind retry of a compare-and-swap, and a retry
  loop can outlive the renew deadline. The callers retry, each within its own deadline. Two
  exceptions, both for requests the server never processed: after a ``401`` the credentials
  are read again (a rotated token file) and, if they changed, the request goes once more.
* As client-go sends them: every request carries an explicit timeout, and tells the server
  too (``?timeout=``, a Go duration) so it stops working on a request the client gave up on;
  ``User-Agent: leader-sidecar/<version> (<os>/<arch>) python/<v> aiohttp/<v>``; the
  kubeconfig's impersonation as ``Impersonate-*`` headers; the proxy of the kubeconfig or the
  environment (`proxy`). Redirects are never followed (client-go refuses them too for
  credentials' sake: our certificate or token must not go to another host).
* A ``429`` or ``5xx`` with ``Retry-After: <seconds>`` (API Priority and Fairness, a server
  shutting down) is reported as `CallError.retry_after` (at most `MAX_RETRY_AFTER`), and by
  the stores as `StoreUnavailable.retry_after`: every retry waits at least that long.
* MicroTime fields go out with exactly six fractional digits and ``Z``; the API server
  answers 400 to ``…T10:00:00+00:00``, which ``datetime.isoformat`` writes for a whole second.
* Every failure becomes a `CallError` with the HTTP status when there was one (0 for transport
  errors: refused, reset, timed out, a configuration that cannot be loaded). Nothing else
  escapes. Its message never carries a credential (URLs are redacted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

import aiohttp
from multidict import CIMultiDict

from sidecar import __version__
from sidecar.logs import log
from sidecar.redact import printable, redact_url
from sidecar.service_account import SERVICE_ACCOUNT_DIR

if TYPE_CHECKING:
    from sidecar.backends.kubernetes.kubeconfig import Connection

logger = logging.getLogger("sidecar.kubernetes")

SERVICE_ACCOUNT_TOKEN = SERVICE_ACCOUNT_DIR / "token"
USER_AGENT = (
    f"leader-sidecar/{__version__} ({platform.system().lower()}/{platform.machine()}) "
    f"python/{platform.python_version()} aiohttp/{aiohttp.__version__}"
)
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
POOL_SIZE = 100  # connections; each watch stream holds one
MAX_RETRY_AFTER = 60.0
"""Seconds: a longer ``Retry-After`` is taken as this (the reflector's longest back-off). A
proxy answering ``Retry-After: 86400`` must not silence a sidecar for a day."""
ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error answer read (a Status is a few hundred)

RBAC_FIX = (
    "grant the sidecar's service account a Role with leases get/list/watch/create/update/patch "
    "and events create in the Lease's namespace, and pods patch in the pods' namespace "
    "(see docs/kubernetes.md, 'RBAC'; the Helm chart renders exactly this)"
)
CREDENTIALS_FIX = (
    "the API server does not accept our credentials: check the service account token (or the "
    "kubeconfig's user); a token file is read again every minute and after each 401"
)


class MicroTime(datetime):
    """A UTC time that serialises as metav1.MicroTime: ``2026-11-29T10:00:00.000000Z``
    (exactly six digits: the API server answers 400 to anything else)."""

    FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.astimezone(UTC).strftime(self.FORMAT)

    @classmethod
    def at(cls, moment: datetime) -> Self:
        moment = moment.astimezone(UTC)
        return cls.combine(moment.date(), moment.time(), tzinfo=UTC)


class Time(MicroTime):
    """A UTC time that serialises as metav1.Time: second precision, ``Z``."""

    FORMAT = "%Y-%m-%dT%H:%M:%SZ"

    @classmethod
    def at(cls, moment: datetime) -> Self:
        return super().at(moment).replace(microsecond=0)


class CallError(Exception):
    """One failed request. ``status`` is the HTTP status, or 0 when no answer came;
    ``retry_after`` the seconds a ``429``/``5xx`` asked us to wait (None: it did not say)."""

    def __init__(
        self,
        op: str,
        status: int,
        reason: str,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        message = redact_url(message)
        super().__init__(f"{op}: {_describe(status, reason, message)}")
        self.op = op
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth another try soon: no answer, throttled, or a server-side failure."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def _describe(status: int, reason: str, message: str) -> str:
    if status == 0:
        return f"no answer ({reason}: {message})" if message else f"no answer ({reason})"
    return f"HTTP {status} {reason}: {message}" if message else f"HTTP {status} {reason}"


def retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """Seconds a ``429`` or ``5xx`` asks us to wait, as client-go reads ``Retry-After``: whole
    seconds, not negative (an HTTP date or garbage: None); at most `MAX_RETRY_AFTER`."""
    if status != 429 and status < 500:
        return None
    value = (headers.get("Retry-After") or "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > 9:
        return None
    return min(float(value), MAX_RETRY_AFTER)


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.ParseDuration`` reads it (``?timeout=``): ``5s``,
    ``2500ms``."""
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_TOKEN.is_file()


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_segment(namespace)}/leases"
    return base if name is None else f"{base}/{_segment(name)}"


def core_path(namespace: str, resource: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{_segment(namespace)}/{resource}"
    return base if name is None else f"{base}/{_segment(name)}"


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class KubeApi:
    """Lazily configured API access with per-request deadlines."""

    def __init__(self, kubeconfig: str | None, request_timeout: float) -> None:
        self.kubeconfig = kubeconfig
        self.request_timeout = request_timeout
        self._connection: Connection | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._refusals_logged: dict[tuple[str, int], float] = {}
        self.server = "in-cluster" if kubeconfig is None else f"kubeconfig {kubeconfig}"

    async def _connect(self) -> tuple[Connection, aiohttp.ClientSession]:
        """The configuration and the session; loads the kubeconfig or the service account on
        first use. Raises whatever loading raises."""
        if self._connection is not None and self._session is not None:
            return self._connection, self._session
        async with self._lock:
            if self._connection is None or self._session is None:
                from sidecar.backends.kubernetes.kubeconfig import load

                connection = await load(self.kubeconfig)
                self.server = redact_url(connection.server)
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=POOL_SIZE, ssl=connection.ssl),
                    headers={"User-Agent": USER_AGENT, "Accept": JSON},
                    skip_auto_headers=("Content-Type",),
                )
                self._connection = connection
        return self._connection, self._session

    async def _send(
        self,
        op: str,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        total: float,
        server_timeout: float,
    ) -> aiohttp.ClientResponse:
        """Send one request; the response once its headers are in. After a ``401``, once
        more if the credentials changed when read again. Raises `CallError` (status 0) for a
        configuration that cannot be loaded."""
        try:
            connection, session = await self._connect()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise CallError(
                op, 0, "ConfigError", f"cannot load the Kubernetes client configuration: {exc}"
            ) from exc
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
        params = {**(query or {}), "timeout": go_duration(server_timeout)}
        for attempt in range(2):
            try:
                credentials = await connection.credentials.headers()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise CallError(op, 0, "ConfigError", f"no credentials: {exc}") from exc
            headers: CIMultiDict[str] = CIMultiDict(credentials)
            for name, value in connection.impersonation:
                headers.add(name, value)
            if data is not None:
                headers["Content-Type"] = content_type
            proxy = connection.proxy
            if proxy is not None:
                headers.update(proxy.request_headers(connection.server))
            response = await session.request(
                method,
                connection.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=total),
                server_hostname=connection.server_hostname,
                proxy=proxy.url if proxy is not None else None,
                proxy_headers=proxy.headers if proxy is not None else None,
                allow_redirects=False,
            )
            if response.status != 401 or attempt or not await self._refreshed(connection):
                return response
            response.release()
        raise AssertionError("unreachable")

    @staticmethod
    async def _refreshed(connection: Connection) -> bool:
        """After a ``401``: whether reading the credentials again changed them."""
        try:
            return await connection.credentials.refresh()
        except asyncio.CancelledError:
            raise
        except Exception:
            return False

    async def request(
        self,
        op: str,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> Any:
        """One request, its JSON answer decoded, all within ``timeout`` (default: the request
        timeout). Raises `CallError` for every failure, an HTTP status outside 2xx included."""
        budget = self.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(budget):
                response = await self._send(
                    op, method, path, query=query, body=body, content_type=content_type,
                    total=budget, server_timeout=budget,
                )  # fmt: skip
                async with response:
                    if 200 <= response.status < 300:
                        raw = await response.read()
                    else:
                        raise await self.error_of(op, response)
        except TimeoutError:
            raise CallError(op, 0, f"timed out after {budget:.3f}s", "") from None
        except (CallError, asyncio.CancelledError):
            raise
        except Exception as exc:  # aiohttp errors, OSError, ssl errors
            raise CallError(op, 0, type(exc).__name__, str(exc)) from exc
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise CallError(op, 0, "bad JSON in the answer", str(exc)) from None

    async def error_of(self, op: str, response: aiohttp.ClientResponse) -> CallError:
        """The `CallError` of an answer outside 2xx (its body read, up to `ERROR_BODY_LIMIT`
        bytes); refusals logged (`log_refused`)."""
        status = response.status
        try:
            raw = await response.content.read(ERROR_BODY_LIMIT)
        except Exception as exc:  # the body broke off: the status still says enough
            raw = f"({type(exc).__name__} reading the answer)".encode()
        reason, message = status_text(raw, response.reason or "")
        if 300 <= status < 400:
            location = printable(response.headers.get("Location", "")[:300])
            message = f"redirected to {location or '(no Location)'}; redirects are not followed"
        if status in (401, 403):
            self.log_refused(op, status, message)
        return CallError(
            op, status, reason, message, retry_after=retry_after(status, response.headers)
        )

    @contextlib.asynccontextmanager
    async def stream(
        self, op: str, path: str, query: Mapping[str, str], timeout: float
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A streaming GET (a watch): the response once its headers are in (within the request
        timeout), whatever its status; its body may take ``timeout`` more. Raises `CallError`
        when no answer came."""
        budget = self.request_timeout
        try:
            async with asyncio.timeout(budget):
                response = await self._send(
                    op, "GET", path, query=query, body=None, content_type=JSON,
                    total=timeout + budget, server_timeout=timeout,
                )  # fmt: skip
        except TimeoutError:
            raise CallError(op, 0, f"timed out after {budget:.3f}s", "") from None
        except (CallError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise CallError(op, 0, type(exc).__name__, str(exc)) from exc
        try:
            yield response
        finally:
            response.release()

    def log_refused(self, op: str, status: int, message: str) -> None:
        """Loud, but once a minute per operation: a missing RBAC rule (403) or credentials
        the server does not take (401) do not fix themselves."""
        now = time.monotonic()
        if now - self._refusals_logged.get((op, status), float("-inf")) < 60:
            return
        self._refusals_logged[(op, status)] = now
        if status == 401:
            what, fix = "the Kubernetes API refused our credentials (401)", CREDENTIALS_FIX
        else:
            what, fix = "the Kubernetes API refused this request (RBAC)", RBAC_FIX
        log(logger, "error", what, op=op, error=message, fix=fix)

    async def close(self) -> None:
        session, self._session = self._session, None
        self._connection = None
        if session is not None:
            await session.close()


def status_text(body: Any, fallback: str) -> tuple[str, str]:
    """(reason, message) from a Status body; else the HTTP reason phrase and the body's first
    line (API Priority and Fairness answers ``429`` in plain text)."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else body
        return str(status.get("reason") or fallback), str(status.get("message") or "")
    except (ValueError, AttributeError):
        pass
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    lines = text.strip().splitlines()
    return fallback, printable(lines[0][:300]) if lines else ""
