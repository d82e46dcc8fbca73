"""Request input is parsed in bounded time and refused cheaply: durations, ``wait=`` values
and requests aiohttp cannot parse (issue 12, items 1 and 8)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from sidecar.api import create_local_app, create_public_app, parse_wait
from sidecar.backends.memory import MemoryLeaseState
from sidecar.config import parse_duration
from sidecar.limits import Limits
from sidecar.listener import handler_args
from tests.unit.test_api import make_elector

HOSTILE = "1" + " " * 8000 + "x"  # quadratic for the old regular expression (~0.5 s)


def test_a_long_hostile_duration_is_refused_in_well_under_a_millisecond_per_call() -> None:
    started = time.perf_counter()
    for _ in range(100):
        with pytest.raises(ValueError, match="positive duration"):
            parse_duration(HOSTILE)
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("0s", 0.0), ("0ms", 0.0), ("15", 15.0), ("1.5s", 1.5), ("250ms", 0.25)],
)
def test_wait_accepts_zero_and_durations(text: str, seconds: float) -> None:
    assert parse_wait(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "\u0663",  # ARABIC-INDIC DIGIT THREE: float() would take it
        "\uff15s",  # FULLWIDTH DIGIT FIVE
        "1\u00a0s",  # a no-break space
        "-1",
        "1e3",
        "inf",
        "nan",
        "0x10",
        "1_000",
        HOSTILE,
        "9" * 40,
    ],
    ids=repr,
)
def test_wait_refuses_anything_but_ascii_digits_and_a_unit(text: str) -> None:
    with pytest.raises(ValueError, match="wait"):
        parse_wait(text)


async def _client(app: web.Application) -> TestClient[web.Request, web.Application]:
    """Served with the sidecar's own request-handler settings (logger, header limits)."""
    server = TestServer(app)
    await server.start_server(**handler_args(Limits()))
    client = TestClient(server)
    await client.start_server()
    return client


async def test_a_hostile_wait_gets_a_fast_400_and_keeps_the_loop_free() -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    async with await _client(create_local_app(elector)) as client:
        etag = (await client.get("/leader")).headers["ETag"]
        started = time.perf_counter()
        for _ in range(20):
            response = await client.get(
                "/leader", params={"wait": HOSTILE}, headers={"If-None-Match": etag}
            )
            assert response.status == 400
            body = await response.json()
            assert "\n" not in body["error"]
            assert HOSTILE not in body["error"]
        assert time.perf_counter() - started < 1.0
        assert elector.is_leader()


async def test_wait_zero_with_a_unit_answers_at_once() -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    async with await _client(create_local_app(elector)) as client:
        etag = (await client.get("/leader")).headers["ETag"]
        response = await asyncio.wait_for(
            client.get("/leader", params={"wait": "0s"}, headers={"If-None-Match": etag}), 2
        )
        assert response.status == 200


async def test_malformed_requests_get_400_and_no_error_level_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    app = create_public_app(elector, CollectorRegistry(), dict)
    async with await _client(app) as client:
        assert client.port is not None
        caplog.set_level(logging.DEBUG)
        statuses = []
        for request in (
            b"GET /leader HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET /\x00leader HTTP/1.1\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n",
        ):
            statuses.append(await _raw_status(client.port, request))
        assert all(status in (400, 431) for status in statuses), statuses
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert loud == [], [r.getMessage() for r in loud]
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
        assert elector.is_leader()


async def _raw_status(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        return int(line.split()[1])
    finally:
        writer.close()
