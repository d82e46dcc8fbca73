"""List-then-watch of Leases, shared by the one-Lease watch (``fieldSelector=metadata.name``)
and the namespace watch of many Leases (``labelSelector``, `sidecar.backends.kubernetes.fanout`).

The loop both follow: list, then watch from the list's resourceVersion; resume from the last
resourceVersion when the server ends a watch cleanly (``timeoutSeconds``); list again after 410
Gone and after any broken connection (the API server may have restarted with its storage wiped
or restored, and resuming from a resourceVersion it no longer knows can be silent); back off,
jittered, while the API is unreachable or refuses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import AsyncIterator
from typing import Any

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.kubernetes.client import CallError, KubeApi


class Relist(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class WatchBroken(Exception):
    """The watch failed in a way worth a reconnect with backoff."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which Leases of one namespace a list or watch asks for."""

    namespace: str
    field_selector: str | None = None
    label_selector: str | None = None

    def query(self) -> dict[str, str]:
        selectors = {"field_selector": self.field_selector, "label_selector": self.label_selector}
        return {key: value for key, value in selectors.items() if value}


def backoff(failures: int, rng: random.Random) -> float:
    """Seconds to wait before reconnecting after ``failures`` failures in a row."""
    base = min(2.0, 0.05 * 2.0 ** (failures - 1))
    return base * rng.uniform(0.5, 1.0)


def unavailable(error: CallError, namespace: str) -> StoreUnavailable:
    if error.status == 404 and error.reason == "NotFound" and "namespaces" in error.message:
        return StoreUnavailable(f"{error}; create namespace {namespace} or fix --namespace")
    return StoreUnavailable(str(error))


async def coordination(api: KubeApi) -> Any:
    try:
        return await api.coordination()
    except Exception as exc:
        raise StoreUnavailable(f"cannot load the Kubernetes client configuration: {exc}") from exc


async def list_leases(api: KubeApi, selection: Selection, op: str) -> tuple[list[Any], str]:
    """The selected Leases and the list's resourceVersion. Raises StoreUnavailable."""
    leases = await coordination(api)
    try:
        listed = await api.call(
            op,
            lambda: leases.list_namespaced_lease(
                selection.namespace, **selection.query(), _request_timeout=api.request_timeout
            ),
        )
    except CallError as error:
        raise unavailable(error, selection.namespace) from None
    return list(listed.items or []), str(listed.metadata.resource_version)


async def stream_leases(
    api: KubeApi, selection: Selection, version: str, timeout: float, op: str
) -> AsyncIterator[tuple[str, Any, str]]:
    """(event type, Lease or None, resourceVersion to resume from) per watch event. Ends when
    the server ends the watch; raises `Relist`, `WatchBroken`, CallError or StoreUnavailable."""
    from kubernetes.aio import client

    leases = await coordination(api)
    response = await api.call(
        op,
        lambda: leases.list_namespaced_lease_without_preload_content(
            selection.namespace,
            **selection.query(),
            resource_version=version,
            allow_watch_bookmarks=True,
            watch=True,
            timeout_seconds=int(timeout),
            _request_timeout=timeout + api.request_timeout,
        ),
    )
    try:
        if response.status == 410:
            raise Relist(f"HTTP 410 for resourceVersion {version}")
        if response.status != 200:
            body = await response.text()
            if response.status == 403:
                api.log_forbidden(op, body.strip()[:300])
            raise WatchBroken(f"watch answered HTTP {response.status}: {body.strip()[:300]}")
        while True:
            try:
                async with asyncio.timeout(timeout + api.request_timeout):
                    line = await response.content.readline()
            except TimeoutError:
                raise WatchBroken("the watch stream went silent") from None
            except Exception as exc:  # aiohttp payload/connection errors
                raise WatchBroken(f"{type(exc).__name__}: {exc}") from exc
            if not line:
                return  # the server ended the watch (timeoutSeconds): resume from version
            event = json.loads(line)
            kind = event.get("type")
            raw = event.get("object") or {}
            if kind == "ERROR":
                if raw.get("code") == 410:
                    raise Relist(str(raw.get("message")))
                raise WatchBroken(f"watch ERROR event: {raw.get('message')}")
            resume_at = str((raw.get("metadata") or {}).get("resourceVersion") or version)
            version = resume_at
            if kind == "BOOKMARK":
                yield kind, None, resume_at
                continue
            yield kind, client.V1Lease.from_dict(raw), resume_at
    finally:
        response.release()
