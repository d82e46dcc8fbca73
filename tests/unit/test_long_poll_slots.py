"""Long-poll slots (issue 25): freed as soon as the client goes away, and on the public
listener limited per client address too; and every JSON body parsed in bounded depth.

Before, 64 ``GET /leases?wait=300`` whose sockets closed at once held all 64 slots for the
whole wait, and every other long-poll on the public port answered 503 for up to 300 s; a
body nested 1,000 deep answered 500 with a traceback in the log."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from sidecar import bounded_json
from sidecar.api import LONG_POLLS, create_local_app, create_public_app
from sidecar.backends.memory import MemoryLeaseState
from sidecar.config import HostPort
from sidecar.elector import Elector
from sidecar.limits import Limits, Slots
from sidecar.listener import Listener
from tests.support import raw_http
from tests.unit.test_api import make_elector

LIMITS = Limits(max_long_polls=6, max_long_polls_per_peer=3)


@pytest.fixture
async def leader() -> Elector:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    return elector


@pytest.fixture
async def listeners(leader: Elector) -> AsyncIterator[dict[str, Listener]]:
    started = {
        "local": Listener(
            "local", create_local_app(leader, LIMITS), HostPort("127.0.0.1", 0), LIMITS
        ),
        "public": Listener(
            "public",
            create_public_app(leader, CollectorRegistry(), dict, LIMITS),
            HostPort("127.0.0.1", 0),
            LIMITS,
        ),
    }
    for listener in started.values():
        await listener.start()
    yield started
    for listener in started.values():
        await listener.stop()


def address(listener: Listener) -> str:
    return f"{listener.address.host}:{listener.address.port}"


async def held_long_polls(
    listener: Listener, etag: str, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    held = []
    for _ in range(count):
        reader, writer = await raw_http.connect(address(listener))
        writer.write(raw_http.get("/leases?wait=300", f"If-None-Match: {etag}"))
        await writer.drain()
        held.append((reader, writer))
    return held


async def until(condition: object, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110 (a poll on purpose)
            await asyncio.sleep(0.005)


async def test_a_long_poll_whose_client_goes_away_frees_its_slot_at_once(
    listeners: dict[str, Listener],
) -> None:
    local = listeners["local"]
    slots = local.runner.app[LONG_POLLS]
    first = await raw_http.ask(address(local), raw_http.get("/leases"))
    etag = first.headers["etag"]
    held = await held_long_polls(local, etag, LIMITS.max_long_polls)
    await until(lambda: slots.in_use == LIMITS.max_long_polls)
    refused = await raw_http.ask(
        address(local), raw_http.get("/leases?wait=300", f"If-None-Match: {etag}")
    )
    assert refused.status == 503
    raw_http.close_all([writer for _, writer in held])
    await until(lambda: slots.in_use == 0, timeout=1.0)  # not after the 300 s
    _, writer = (await held_long_polls(local, etag, 1))[0]
    await until(lambda: slots.in_use == 1)
    writer.close()


async def test_one_address_holds_at_most_its_share_of_the_public_long_polls(
    listeners: dict[str, Listener],
) -> None:
    public, local = listeners["public"], listeners["local"]
    etag = (await raw_http.ask(address(public), raw_http.get("/leases"))).headers["etag"]
    held = await held_long_polls(public, etag, LIMITS.max_long_polls_per_peer)
    slots = public.runner.app[LONG_POLLS]
    await until(lambda: slots.in_use == LIMITS.max_long_polls_per_peer)
    for path in ("/leases?wait=300", "/leader?wait=300", "/leader/default?wait=300"):
        refused = await raw_http.ask(address(public), raw_http.get(path, f"If-None-Match: {etag}"))
        assert refused.status == 503, path
        assert refused.headers["retry-after"] == "1"
    assert slots.refused_per_peer == 3
    # On localhost every client is 127.0.0.1 (the app's own processes): no per-address limit.
    local_held = await held_long_polls(local, etag, LIMITS.max_long_polls_per_peer + 2)
    await until(lambda: local.runner.app[LONG_POLLS].in_use == LIMITS.max_long_polls_per_peer + 2)
    raw_http.close_all([writer for _, writer in held + local_held])


def test_slots_count_per_address_and_give_back() -> None:
    slots = Slots("long-polls", 4, per_peer=2)
    with slots.take("10.0.0.1") as a, slots.take("10.0.0.1") as b, slots.take("10.0.0.1") as c:
        assert (a, b, c) == (True, True, False)
        with slots.take("10.0.0.2") as d:
            assert d
            assert slots.in_use == 3
    assert slots.in_use == 0
    assert slots._peers == {}  # nothing kept for addresses that hold nothing
    assert (slots.refused, slots.refused_per_peer) == (1, 1)


@pytest.mark.parametrize("path", ["/leader/transfer", "/leader/release"])
async def test_a_body_nested_too_deep_is_a_400_not_a_traceback(
    listeners: dict[str, Listener], caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.DEBUG)
    local = listeners["local"]
    body = b"[" * 1000 + b"]" * 1000
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {address(local)}\r\n"
        f"Content-Type: application/json\r\nX-Leader-Sidecar: transfer\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answer = await raw_http.ask(address(local), request)
    assert answer.status == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]


def test_the_depth_is_measured_before_parsing_and_strings_do_not_count() -> None:
    assert bounded_json.loads(b'{"to": "[[[[[[[[{{{{{{"}', 1) == {"to": "[[[[[[[[{{{{{{"}
    assert bounded_json.loads(b'{"a": "\\"[[["}', 1) == {"a": '"[[['}
    with pytest.raises(bounded_json.TooDeep, match="at most 2 levels"):
        bounded_json.loads(b'{"a": [[1]]}', 2)
    with pytest.raises(bounded_json.TooDeep):
        bounded_json.loads(b"[" * 100_000, 4)  # refused before the parser recurses
    with pytest.raises(ValueError):  # noqa: PT011 (json's own errors are ValueErrors)
        bounded_json.loads(b"\xff", 4)
