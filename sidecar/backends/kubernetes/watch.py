"""The requests of a list-then-watch of Leases: the list, the watch stream and its lines. The
loop around them — when to list again, when to resume, how long to wait — is
`sidecar.backends.kubernetes.reflector`, the one every watch of the sidecar uses.

A watch is a streaming GET (``?watch=1&resourceVersion=…&allowWatchBookmarks=true&
timeoutSeconds=…``) answering one JSON event per line. A line longer than `MAX_EVENT_LINE`
breaks the watch (and the loop lists again) rather than growing the buffer without bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.kubernetes.client import CallError, KubeApi, lease_path


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
        selectors = {"fieldSelector": self.field_selector, "labelSelector": self.label_selector}
        return {key: value for key, value in selectors.items() if value}


def unavailable(error: CallError, namespace: str) -> StoreUnavailable:
    if error.status == 404 and error.reason == "NotFound" and "namespaces" in error.message:
        return StoreUnavailable(f"{error}; create namespace {namespace} or fix --namespace")
    return StoreUnavailable(str(error), retry_after=error.retry_after)


async def list_leases(
    api: KubeApi, selection: Selection, op: str
) -> tuple[list[dict[str, Any]], str]:
    """The selected Leases and the list's resourceVersion. Raises StoreUnavailable."""
    try:
        listed = await api.request(
            op, "GET", lease_path(selection.namespace), query=selection.query()
        )
    except CallError as error:
        raise unavailable(error, selection.namespace) from None
    items = [item for item in listed.get("items") or [] if isinstance(item, dict)]
    return items, str((listed.get("metadata") or {}).get("resourceVersion"))


async def stream_leases(
    api: KubeApi, selection: Selection, version: str, timeout: float, op: str
) -> AsyncIterator[tuple[str, dict[str, Any] | None, str]]:
    """(event type, Lease or None, resourceVersion to resume from) per watch event. Ends when
    the server ends the watch; raises `Relist`, `WatchBroken`, CallError or StoreUnavailable."""
    query = {
        **selection.query(),
        "watch": "1",
        "resourceVersion": version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(int(timeout)),
    }
    async with api.stream(op, lease_path(selection.namespace), query, timeout) as response:
        if response.status == 410:
            raise Relist(f"HTTP 410 for resourceVersion {version}")
        if response.status != 200:
            raise await api.error_of(op, response)
        async for line in event_lines(response.content, timeout + api.request_timeout):
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
            yield kind, raw, resume_at


MAX_EVENT_LINE = 4 * 1024 * 1024
"""Bytes in one watch event line. etcd refuses objects over 1.5 MiB by default; a Lease is
a few hundred bytes, a candidates Lease at most its 256 KiB of annotations."""


async def event_lines(
    content: aiohttp.StreamReader, silence: float, limit: int = MAX_EVENT_LINE
) -> AsyncIterator[bytes]:
    """The non-empty lines of a watch body until the server ends it. Raises `WatchBroken` when
    nothing arrives for ``silence`` seconds, the connection breaks, or a line passes
    ``limit`` bytes."""
    buffer = bytearray()
    while True:
        try:
            async with asyncio.timeout(silence):
                chunk = await content.readany()
        except TimeoutError:
            raise WatchBroken("the watch stream went silent") from None
        except Exception as exc:  # aiohttp payload/connection errors
            raise WatchBroken(f"{type(exc).__name__}: {exc}") from exc
        if not chunk:
            if buffer.strip():
                yield bytes(buffer)  # a last line without its newline
            return  # the server ended the watch (timeoutSeconds): resume from version
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if len(line) > limit:
                raise WatchBroken(f"a watch event longer than {limit} bytes; refused")
            if line.strip():
                yield line
        if len(buffer) > limit:
            raise WatchBroken(f"a watch event longer than {limit} bytes; refused")
