"""The official asyncio client (``kubernetes.aio``), set up the way a lease needs it.

* One `ApiClient` per process, shared by the lease store and the demotion actions, built on
  first use (loading a kubeconfig is a coroutine; construction is not).
* No client-side retries: a retried PUT would be a blind retry of a compare-and-swap, and a
  retry loop can outlive the renew deadline. Every request carries an explicit timeout.
* MicroTime fields go out with exactly six fractional digits and ``Z``: the client would
  write ``…T10:00:00+00:00`` for a whole second, which the API server refuses with a 400.
* Every failure becomes a `CallError` with the HTTP status when there was one (0 for transport
  errors: refused, reset, timed out). Nothing else escapes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

from sidecar.logs import log

T = TypeVar("T")
logger = logging.getLogger("sidecar.kubernetes")

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
USER_AGENT = "leader-sidecar"

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


def warm_up() -> None:
    """Import what the lease needs now, at start-up, not inside the event loop on first use:
    ``kubernetes.aio.client`` takes ~0.3 s to import, long enough to delay a renewal."""
    import kubernetes.aio.client.api.coordination_v1_api
    import kubernetes.aio.config  # noqa: F401


def _import_core_api() -> None:
    import kubernetes.aio.client.api.core_v1_api  # noqa: F401


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_TOKEN.is_file()


class KubeApi:
    """Lazily configured API access with per-request deadlines."""

    def __init__(self, kubeconfig: str | None, request_timeout: float) -> None:
        self.kubeconfig = kubeconfig
        self.request_timeout = request_timeout
        self._client: Any = None
        self._lock = asyncio.Lock()
        self._forbidden_logged: dict[str, float] = {}
        self._core_imported: asyncio.Future[None] | None = None
        self.server = "in-cluster" if kubeconfig is None else f"kubeconfig {kubeconfig}"

    async def client(self) -> Any:
        """The shared ApiClient; loads the kubeconfig or the service account on first use."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                from kubernetes.aio import client, config

                configuration = client.Configuration()
                if self.kubeconfig:
                    await config.load_kube_config(  # type: ignore[no-untyped-call]
                        config_file=self.kubeconfig,
                        client_configuration=configuration,
                        persist_config=False,
                    )
                else:
                    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                configuration.retries = None  # see module docstring: no hidden retries
                self.server = str(configuration.host)
                api = client.ApiClient(configuration=configuration)
                api.user_agent = USER_AGENT
                self._client = api
        return self._client

    async def coordination(self) -> Any:
        from kubernetes.aio import client

        return client.CoordinationV1Api(await self.client())

    async def core(self) -> Any:
        """CoreV1Api (pod labels, Events), imported on first use, on a thread: the generated
        module costs ~0.5 s and ~20 MiB, which a replica that never leads never needs, and an
        import on the event loop would stall renewals for that long."""
        if self._core_imported is None:
            self._core_imported = asyncio.ensure_future(asyncio.to_thread(_import_core_api))
        await asyncio.shield(self._core_imported)
        from kubernetes.aio import client

        return client.CoreV1Api(await self.client())

    async def call(
        self, op: str, request: Callable[[], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """Run one request under ``timeout`` (default: the request timeout). Raises
        `CallError` for every failure."""
        from kubernetes.aio.client.exceptions import ApiException

        budget = self.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(budget):
                return await request()
        except TimeoutError:
            raise CallError(op, 0, f"timed out after {budget:.3f}s", "") from None
        except ApiException as exc:
            status = int(exc.status or 0)
            reason, message = status_text(exc.body, str(exc.reason or ""))
            error = CallError(op, status, reason, message)
            if status == 403:
                self.log_forbidden(op, message)
            raise error from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # aiohttp errors, OSError, pydantic, config errors
            raise CallError(op, 0, type(exc).__name__, str(exc)) from exc

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
        if self._client is not None:
            await self._client.close()
            self._client = None


def status_text(body: Any, fallback: str) -> tuple[str, str]:
    """(reason, message) from a Status body, or the HTTP reason phrase."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else body
        return str(status.get("reason") or fallback), str(status.get("message") or "")
    except (ValueError, AttributeError):
        return fallback, ""
