"""``POST /leader/release`` refuses what a web page can send: simple cross-site requests,
foreign origins and DNS rebinding (issue 12, item 3). The app's own calls still work."""

from __future__ import annotations

import pytest

from sidecar.api import create_local_app
from sidecar.backends.memory import MemoryLeaseState
from tests.unit.test_api import client_for, make_elector

REFUSED = [
    pytest.param({"Content-Type": "text/plain"}, id="simple request, no custom header"),
    pytest.param(
        {"Content-Type": "text/plain", "Origin": "http://evil.example"},
        id="simple cross-site form post",
    ),
    pytest.param(
        {"X-Leader-Sidecar": "release", "Origin": "https://evil.example"},
        id="custom header from a foreign origin",
    ),
    pytest.param(
        {"Content-Type": "application/json", "Origin": "null"}, id="sandboxed or file origin"
    ),
    pytest.param(
        {"X-Leader-Sidecar": "release", "Host": "evil.example:{port}"}, id="DNS rebinding"
    ),
    pytest.param({"X-Leader-Sidecar": "release", "Host": "127.0.0.1:1"}, id="another port"),
]

ALLOWED = [
    pytest.param({"X-Leader-Sidecar": "release"}, id="curl with the header"),
    pytest.param({"Content-Type": "application/json"}, id="a JSON post"),
    pytest.param({"X-Leader-Sidecar": "release", "Host": "localhost:{port}"}, id="Host: localhost"),
    pytest.param(
        {"Content-Type": "application/json; charset=utf-8", "Origin": "http://localhost:3000"},
        id="a local page",
    ),
]


def _fill(headers: dict[str, str], port: int) -> dict[str, str]:
    return {name: value.format(port=port) for name, value in headers.items()}


@pytest.mark.parametrize("headers", REFUSED)
async def test_a_release_a_web_page_could_send_is_refused_with_403(
    headers: dict[str, str],
) -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    term = elector.status().term
    async with await client_for(create_local_app(elector)) as client:
        assert client.port is not None
        response = await client.post("/leader/release", headers=_fill(headers, client.port))
        body = await response.json()
        assert response.status == 403
        assert body["error"]
        assert "\n" not in body["error"]
        assert elector.is_leader()
        assert elector.status().term == term


@pytest.mark.parametrize("headers", ALLOWED)
async def test_a_release_from_a_local_program_steps_down(headers: dict[str, str]) -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    async with await client_for(create_local_app(elector)) as client:
        assert client.port is not None
        response = await client.post("/leader/release", headers=_fill(headers, client.port))
        assert response.status == 200
        assert (await response.json())["released"] is True
        assert not elector.is_leader()
