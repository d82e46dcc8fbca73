"""A neighbour that opens thousands of connections, long-polls or event streams, or never
finishes a request, changes nothing about who leads (issue 12, items 4 and 5). One real
sidecar process on SQLite; every limit is per listener and answered fast."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.limits import DEFAULT_LIMITS as DEFAULTS
from sidecar.listener import EVICT_IDLE_SECONDS
from tests.support import raw_http
from tests.support.sidecars import SidecarProcess, sidecars

pytestmark = pytest.mark.slow

LEASE = "2s"


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leases.db'}"


async def leader_state(address: str) -> tuple[int, dict[str, Any], str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://{address}/leader") as response,
    ):
        return response.status, await response.json(), response.headers["ETag"]


async def until_leader(sidecar: SidecarProcess, timeout: float = 10.0) -> tuple[int, str]:
    """The term and ETag once the sidecar leads."""
    deadline = time.monotonic() + timeout
    while True:
        status, body, etag = await leader_state(sidecar.public)
        if status == 200:
            return body["term"], etag
        assert time.monotonic() < deadline, "the sidecar did not become leader"
        sidecar.wait_log(lambda e: e.get("msg") == "became leader", timeout)


async def assert_still_leading(sidecar: SidecarProcess, term: int) -> None:
    for address in (sidecar.local, sidecar.public):
        status, body, _ = await leader_state(address)
        assert status == 200, body
        assert body["term"] == term


async def until_connections(
    sidecar: SidecarProcess, listener: str, count: int, long_polls: int = 0
) -> dict[str, Any]:
    """Ask the sidecar (SIGUSR1 state dump) until ``listener`` holds ``count`` connections
    (and ``long_polls`` long-polls); its counters then."""
    deadline = time.monotonic() + 20
    while True:
        seen = len(sidecar.logs)
        sidecar.signal(signal.SIGUSR1)
        while not (states := [e for e in sidecar.logs[seen:] if e.get("msg") == "state"]):
            assert time.monotonic() < deadline, "no state dump after SIGUSR1"
            await asyncio.sleep(0.05)
        usage: dict[str, Any] = states[0]["listeners"][listener]
        if usage["connections"] >= count and usage["long_polls"] >= long_polls:
            return usage
        assert time.monotonic() < deadline, usage


def rss_kib(sidecar: SidecarProcess) -> int:
    for line in Path(f"/proc/{sidecar.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_connections_that_never_finish_a_request_head_are_closed(tmp_path: Path) -> None:
    args = ["--idle-timeout", "2s"]
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, args=args) as [a]:
        term, _ = await until_leader(a)
        streams = [await raw_http.connect(a.public) for _ in range(50)]
        for _, writer in streams:
            writer.write(b"GET /leader HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never ends
        started = time.monotonic()
        closed = await asyncio.gather(
            *(raw_http.closed_within(reader, 10.0) for reader, _ in streams)
        )
        raw_http.close_all([writer for _, writer in streams])
        assert sum(closed) == len(streams)
        assert time.monotonic() - started < 10.0
        await assert_still_leading(a, term)


async def test_a_request_head_that_ends_in_a_later_read_is_not_closed_as_too_slow(
    tmp_path: Path,
) -> None:
    """The idle timeout is for a head that never ends: one whose last line ends a read later
    (even its final CR and LF apart) is a request, and its long-poll outlives the timeout."""
    args = ["--idle-timeout", "1s"]
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, args=args) as [a]:
        term, etag = await until_leader(a)
        request = raw_http.get("/leader?wait=2500ms", f"If-None-Match: {etag}")
        assert request.endswith(b"\r\n\r\n")
        ends = {"CR LF | CR LF": request[:-2], "CR LF CR | LF": request[:-1]}
        streams = {}
        for name, first in ends.items():
            reader, writer = await raw_http.connect(a.local)
            writer.write(first)
            await writer.drain()
            streams[name] = (reader, writer)
        await asyncio.sleep(0.3)
        for name, first in ends.items():
            streams[name][1].write(request[len(first) :])
        started = time.monotonic()
        for name, (reader, _) in streams.items():
            answer = await raw_http.read_head(reader, 10)
            assert answer.status == 200, name
        assert time.monotonic() - started > 2.0, "answered before its wait: not a held poll"
        raw_http.close_all([writer for _, writer in streams.values()])
        await assert_still_leading(a, term)


async def test_at_the_connection_limit_the_oldest_idle_connection_makes_room(
    tmp_path: Path,
) -> None:
    """A flood of idle connections cannot lock the kubelet's probes out of the public port."""
    # Idle connections hold their slots until the idle timeout: longer than the test.
    args = ["--idle-timeout", "60s"]
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, args=args) as [a]:
        term, _ = await until_leader(a)
        held = [await raw_http.connect(a.public) for _ in range(DEFAULTS.max_connections)]
        # connect() can return before the sidecar accepted (a full accept queue), so ask it.
        state = await until_connections(a, "public", DEFAULTS.max_connections)
        await asyncio.sleep(EVICT_IDLE_SECONDS)  # by the rule: only a quiet one makes room
        oldest = next(iter(held))[0]
        started = time.monotonic()
        probe = await raw_http.ask(a.public, raw_http.get("/healthz"))
        assert probe.status == 200
        assert time.monotonic() - started < 1.0
        assert await raw_http.closed_within(oldest, 5.0), "no idle connection made room"
        local = await raw_http.ask(a.local, raw_http.get("/leader"))
        assert local.status == 200, "a flood on the public port took the localhost listener"
        assert state["accept_errors"] == 0
        raw_http.close_all([writer for _, writer in held])
        await assert_still_leading(a, term)


async def test_a_request_head_trickling_in_does_not_keep_its_connection_from_making_room(
    tmp_path: Path,
) -> None:
    """Bytes of a head that never ends are not activity: at the limit, such connections are
    the quiet ones, closed to make room before the idle timeout."""
    args = ["--max-connections", "8", "--idle-timeout", "60s"]
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, args=args) as [a]:
        term, _ = await until_leader(a)
        trickling = [await raw_http.connect(a.local) for _ in range(8)]
        for _, writer in trickling:
            writer.write(b"GET /leader HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await until_connections(a, "local", 8)
        started = time.monotonic()
        while time.monotonic() - started < EVICT_IDLE_SECONDS + 0.5:
            for _, writer in trickling:
                writer.write(b"X")  # one more byte of a header line, never ended
            await asyncio.sleep(0.1)
        answer = await raw_http.ask(a.local, raw_http.get("/leader"))
        assert answer.status == 200, "every slot kept by a head trickling in"
        closed = await asyncio.gather(*(raw_http.closed_within(r, 2.0) for r, _ in trickling))
        assert sum(closed) >= 1
        raw_http.close_all([writer for _, writer in trickling])
        await assert_still_leading(a, term)


async def test_when_every_connection_is_busy_a_new_one_gets_a_fast_503(tmp_path: Path) -> None:
    """Requests that wait (long-polls on `/leader` and `/leases`, event streams) are never
    closed to make room, however long they have been quiet."""
    args = ["--max-connections", "8"]
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, args=args) as [a]:
        term, etag = await until_leader(a)
        leases = await raw_http.ask(a.local, raw_http.get("/leases"))
        waits = [
            *[raw_http.get("/leader?wait=30", f"If-None-Match: {etag}")] * 5,
            *[raw_http.get("/leases?wait=30", f"If-None-Match: {leases.headers['etag']}")] * 2,
            raw_http.get("/events"),
        ]
        held = [await raw_http.connect(a.local) for _ in waits]
        for (_, writer), request in zip(held, waits, strict=True):
            writer.write(request)
        await until_connections(a, "local", 8, long_polls=7)
        await asyncio.sleep(EVICT_IDLE_SECONDS)  # by the rule: quiet ones could make room now
        started = time.monotonic()
        answer = await raw_http.ask(a.local, raw_http.get("/leader"))
        assert answer.status == 503
        assert answer.headers["retry-after"] == "1"
        assert time.monotonic() - started < 1.0
        assert not any(await asyncio.gather(*(raw_http.closed_within(r, 0.2) for r, _ in held)))
        raw_http.close_all([writer for _, writer in held])
        deadline = time.monotonic() + 5
        while (await raw_http.ask(a.local, raw_http.get("/leader"))).status != 200:
            assert time.monotonic() < deadline, "slots not given back after the flood closed"
        await assert_still_leading(a, term)


async def test_past_the_waiter_limits_long_polls_and_streams_get_a_fast_503(
    tmp_path: Path,
) -> None:
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE) as [a]:
        term, etag = await until_leader(a)
        poll = raw_http.get("/leader?wait=30", f"If-None-Match: {etag}")
        streams = [await raw_http.connect(a.local) for _ in range(DEFAULTS.max_event_streams)]
        for reader, writer in streams:
            writer.write(raw_http.get("/events"))
            assert (await raw_http.read_head(reader, 5)).status == 200  # holds its slot now
        refused = await raw_http.ask(a.local, raw_http.get("/events"))
        assert refused.status == 503
        assert refused.headers["retry-after"] == "1"

        polls = [await raw_http.connect(a.local) for _ in range(DEFAULTS.max_long_polls)]
        for _, writer in polls:
            writer.write(poll)
        # The next long-poll is refused once all are parked; until then a short one
        # may still get a slot and simply time out with the unchanged state (200).
        short = raw_http.get("/leader?wait=200ms", f"If-None-Match: {etag}")
        deadline = time.monotonic() + 5
        while (answer := await raw_http.ask(a.local, short)).status != 503:
            assert answer.status == 200
            assert time.monotonic() < deadline, "the long-poll past the limit was never refused"
        assert answer.headers["retry-after"] == "1"
        public = await raw_http.ask(a.public, short)
        assert public.status == 200, "limits are per listener"
        raw_http.close_all([writer for _, writer in (*streams, *polls)])
        await assert_still_leading(a, term)


async def test_out_of_file_descriptors_the_accept_loop_backs_off_quietly(
    tmp_path: Path,
) -> None:
    # 64 descriptors: far fewer than the default connection limit, so accept() fails.
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE, max_open_files=64) as [a]:
        term, _ = await until_leader(a)
        lines_before = len(a.raw)
        held = []
        for _ in range(120):  # well past 64 descriptors
            held.append(await raw_http.connect(a.public))
        await asyncio.sleep(2.0)  # the window measured: how much the log grows meanwhile
        flood = [line for line in a.raw[lines_before:] if "accept" in line]
        assert len(flood) <= 3, f"{len(flood)} accept error lines in 2 s: {flood[:3]}"
        raw_http.close_all([writer for _, writer in held])
        deadline = time.monotonic() + 5
        while True:
            try:
                if (await raw_http.ask(a.public, raw_http.get("/leader"), 2)).status == 200:
                    break
            except (ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, "the public listener did not come back"
        await assert_still_leading(a, term)


async def test_memory_returns_near_its_baseline_after_a_flood_of_waiters(
    tmp_path: Path,
) -> None:
    with sidecars(["a"], store_url(tmp_path), lease_duration=LEASE) as [a]:
        term, etag = await until_leader(a)
        for _ in range(50):  # warm up: the first requests allocate caches that stay
            await raw_http.ask(a.local, raw_http.get("/leader"))
        baseline = rss_kib(a)
        poll = raw_http.get("/leader?wait=60", f"If-None-Match: {etag}")
        flood = []
        for index in range(3000):
            reader, writer = await raw_http.connect(a.local if index % 2 else a.public)
            writer.write(poll if index % 3 else raw_http.get("/events"))
            flood.append((reader, writer))
        await asyncio.sleep(1.0)  # let the sidecar take in what it accepts
        peak = rss_kib(a)
        raw_http.close_all([writer for _, writer in flood])
        await asyncio.sleep(1.0)
        after = rss_kib(a)
        await assert_still_leading(a, term)
        print(json.dumps({"baseline_kib": baseline, "peak_kib": peak, "after_kib": after}))
        assert after <= baseline * 1.2, (baseline, peak, after)
