"""Issue 25's hostile clients replayed against real sidecars: long-polls whose sockets close at
once give their slots back at once (the public port stays usable from anywhere in the
cluster), and bodies nested a thousand deep are refused with a 400 — no 500, no traceback,
no flood of error lines — while the leader keeps leading."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support import raw_http
from tests.support.sidecars import SidecarProcess, observing, sidecars

pytestmark = pytest.mark.slow


async def current_etag(proc: SidecarProcess) -> str:
    answer = await raw_http.ask(proc.public, raw_http.get("/leases"))
    assert answer.status == 200
    return answer.headers["etag"]


async def test_long_polls_closed_at_once_free_their_slots_at_once(tmp_path: Path) -> None:
    """64 ``GET /leases?wait=300`` with the current ETag, each socket closed at once: a
    long-poll asked a moment later is held (not a 503), on both listeners."""
    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a"], store, lease_duration="2s") as [a]:
        async with observing([a]) as observer:
            before = await observer.leader()
            etag = await current_etag(a)
            for listener in (a.public, a.local):
                flood = []
                for _ in range(64):
                    reader, writer = await raw_http.connect(listener)
                    writer.write(raw_http.get("/leases?wait=300", f"If-None-Match: {etag}"))
                    flood.append(writer)
                await asyncio.sleep(0.2)  # every one of them parked or refused
                raw_http.close_all(flood)
                await asyncio.sleep(0.3)
                reader, writer = await raw_http.connect(listener)
                writer.write(raw_http.get("/leases?wait=300", f"If-None-Match: {etag}"))
                await writer.drain()
                with pytest.raises(TimeoutError):  # held, as a long-poll is: no 503
                    await raw_http.read_head(reader, 1.0)
                writer.close()
            after = await observer.leader(after=time.time())
            assert (after.name, after.term) == (before.name, before.term)
            assert not [e for e in a.logs if e.get("level") in ("error", "warning")]


async def test_bodies_nested_a_thousand_deep_are_a_400_and_never_a_traceback(
    tmp_path: Path,
) -> None:
    """Four clients for three seconds: every answer a 400, not one error line (before: a 500
    and a 1.8 KB traceback each, 20 MB of log in 10 s)."""
    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a"], store, lease_duration="2s") as [a]:
        async with observing([a]) as observer:
            before = await observer.leader()
            body = b"[" * 1000 + b"]" * 1000
            statuses: list[int] = []

            async def client(path: str) -> None:
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline:
                    request = (
                        f"POST {path} HTTP/1.1\r\nHost: {a.local}\r\n"
                        "Content-Type: application/json\r\nX-Leader-Sidecar: transfer\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n"
                    ).encode() + body
                    statuses.append((await raw_http.ask(a.local, request)).status)

            logged_before = len(a.raw)
            await asyncio.gather(*(client(p) for p in ["/leader/transfer", "/leader/release"] * 2))
            assert len(statuses) > 20
            assert set(statuses) == {400}
            logged = a.raw[logged_before:]
            assert not [line for line in logged if '"level":"error"' in line], logged[:2]
            assert sum(len(line) for line in logged) < 10_000
            after = await observer.leader(after=time.time())
            assert (after.name, after.term) == (before.name, before.term)
