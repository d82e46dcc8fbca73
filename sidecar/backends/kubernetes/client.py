"""A small REST client of the Kubernetes API over aiohttp, set up the way a lease needs it.

Why not the official client: importing ``kubernetes.aio.client`` costs ~58 MiB of RSS and
~0.9 s (its package imports every API and ~700 models), which is most of the sidecar's memory
and start time. A lease needs a handful of JSON requests and one streaming GET; this module
sends plain dicts and gets plain dicts back (docs/design-changes.md, "The Kubernetes client").

* One `KubeApi` per process, shared by the lease store and the demotion actions, configured on
  first use (`sidecar.backends.kubernetes.kubeconfig`): the pod's service account in a cluster,
  else a kubeconfig. One aiohttp session: an HTTP/1.1 keep-alive pool of 100 connections.
* No retries: a retried PUT would be a blind retry of a compare-and-swap, and a retry loop can
  outlive the renew deadline. Every request carries an explicit timeout.
* MicroTime fields go out with exactly six fractional digits and ``Z``; the API server
  answers 400 to ``…T10:00:00+00:00``, which ``datetime.isoformat`` writes for a whole second.
* Every failure becomes a `CallError` with the HTTP status when there was one (0 for transport
  errors: refused, reset, timed out, a configuration that cannot be loaded). Nothing else
  escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

import aiohttp

from sidecar.config import SERVICE_ACCOUNT_DIR
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.kubernetes.kubeconfig import Connection

logger = logging.getLogger("sidecar.kubernetes")

SERVICE_ACCOUNT_TOKEN = SERVICE_ACCOUNT_DIR / "token"
USER_AGENT = "leader-sidecar"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
POOL_SIZE = 100  # connections; each watch stream holds one

RBAC_FIX = (
    "grant the sidecar's service account a Role with leases get/list/watch/create/update/patch "
    "and events create in the Lease's namespace, and pods patch in the pods' namespace "
    "(see docs/kubernetes.md, 'RBAC'; the Helm chart renders exactly this)"
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


def parse_time(text: Any) -> datetime | None:
    """A metav1.Time or MicroTime as the API server writes it (``…Z``, up to nine fractional
    digits), timezone-aware; None if absent or unreadable. For humans only, never for expiry."""
    if not isinstance(text, str) or not text:
        return None
    head, dot, rest = text.partition(".")
    if dot:  # fromisoformat takes at most six fractional digits before Python 3.12
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class CallError(Exception):
    """One failed request. ``status`` is the HTTP status, or 0 when no answer came."""

    def __init__(self, op: str, status: int, reason: str, message: str) -> None:
        super().__init__(f"{op}: {_describe(status, reason, message)}")
        self.op = op
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth another try soon: no answer, throttled, or a server-side failure."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def _describe(status: int, reason: str, message: str) -> str:
    if status == 0:
        return f"no answer ({reason}: {message})" if message else f"no answer ({reason})"
    return f"HTTP {status} {reason}: {message}" if message else f"HTTP {status} {reason}"


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
        self._forbidden_logged: dict[str, float] = {}
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
                self.server = connection.server
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
    ) -> aiohttp.ClientResponse:
        """Send one request; the response once its headers are in. Raises `CallError` (status
        0) for a configuration that cannot be loaded."""
        try:
            connection, session = await self._connect()
            headers = await connection.credentials.headers()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise CallError(
                op, 0, "ConfigError", f"cannot load the Kubernetes client configuration: {exc}"
            ) from exc
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers = {**headers, "Content-Type": content_type}
        return await session.request(
            method,
            connection.server + path,
            params=query,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=total),
            server_hostname=connection.server_hostname,
            proxy=connection.proxy,
        )

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
                    total=budget,
                )  # fmt: skip
                async with response:
                    raw = await response.read()
                    status, phrase = response.status, response.reason or ""
        except TimeoutError:
            raise CallError(op, 0, f"timed out after {budget:.3f}s", "") from None
        except (CallError, asyncio.CancelledError):
            raise
        except Exception as exc:  # aiohttp errors, OSError, ssl errors
            raise CallError(op, 0, type(exc).__name__, str(exc)) from exc
        if 200 <= status < 300:
            try:
                return json.loads(raw) if raw else {}
            except ValueError as exc:
                raise CallError(op, 0, "bad JSON in the answer", str(exc)) from None
        reason, message = status_text(raw, phrase)
        if status == 403:
            self.log_forbidden(op, message)
        raise CallError(op, status, reason, message)

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
                    total=timeout + budget,
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

    def log_forbidden(self, op: str, message: str) -> None:
        """Loud, but once a minute per operation: a missing RBAC rule does not fix itself."""
        now = time.monotonic()
        if now - self._forbidden_logged.get(op, float("-inf")) < 60:
            return
        self._forbidden_logged[op] = now
        log(
            logger,
            "error",
            "the Kubernetes API refused this request (RBAC)",
            op=op,
            error=message,
            fix=RBAC_FIX,
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        self._connection = None
        if session is not None:
            await session.close()


def status_text(body: Any, fallback: str) -> tuple[str, str]:
    """(reason, message) from a Status body, or the HTTP reason phrase."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else body
        return str(status.get("reason") or fallback), str(status.get("message") or "")
    except (ValueError, AttributeError):
        return fallback, ""
