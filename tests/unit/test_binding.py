"""A listen address that is a host name is served on every address it resolves to, all on one
port, with real sockets and real HTTP requests. The host's resolver is the one seam: this
machine's /etc/hosts maps localhost to 127.0.0.1 only, so a dual-stack name is resolved by
hand; resolving, binding and serving are the sidecar's own."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from sidecar import binding
from sidecar.binding import AddressError, bind_all
from sidecar.config import HostPort
from sidecar.limits import Limits
from sidecar.listener import Listener
from tests.unit.test_config import run_cli

V4 = (socket.AF_INET, "127.0.0.1")
V6 = (socket.AF_INET6, "::1")
ABSENT = (socket.AF_INET, "192.0.2.1")  # TEST-NET-1: never an address of this host


def has_ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")


@pytest.fixture
def resolves_to(monkeypatch: pytest.MonkeyPatch) -> list[binding.Address]:
    """What the name ``dual.test`` resolves to; other names resolve as the host says."""
    answer: list[binding.Address] = []
    real = binding.resolve

    async def resolve(where: HostPort) -> list[binding.Address]:
        return list(answer) if where.host == "dual.test" else await real(where)

    monkeypatch.setattr(binding, "resolve", resolve)
    return answer


async def get(host: str, port: int) -> str:
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


@needs_ipv6
async def test_a_name_for_two_loopbacks_is_served_on_both_on_one_port(
    resolves_to: list[binding.Address],
) -> None:
    """``--listen localhost:0`` on a dual-stack host: a client that tries ::1 first and one
    that tries 127.0.0.1 both reach the sidecar (before, only the first address was bound)."""
    resolves_to += [V4, V6]
    app = web.Application()

    async def here(request: web.Request) -> web.Response:
        return web.Response(text="here")

    app.router.add_get("/", here)
    listener = Listener("local", app, HostPort("dual.test", 0), Limits())
    where = await listener.start()
    try:
        assert listener.bound is not None
        assert listener.bound.addresses() == [f"127.0.0.1:{where.port}", f"[::1]:{where.port}"]
        assert await get("127.0.0.1", where.port) == "here"
        assert await get("::1", where.port) == "here"
    finally:
        await listener.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await get("::1", where.port)


@needs_ipv6
async def test_a_port_taken_on_one_address_fails_the_whole_and_leaves_nothing_bound(
    resolves_to: list[binding.Address],
) -> None:
    taken = socket.create_server(("::1", 0), family=socket.AF_INET6)
    port = taken.getsockname()[1]
    resolves_to += [V4, V6]
    try:
        with pytest.raises(OSError, match="in use") as error:
            await bind_all(HostPort("dual.test", port), 16)
        assert error.value.errno == errno.EADDRINUSE
        # 127.0.0.1 was bound first, and closed again.
        socket.create_server(("127.0.0.1", port)).close()
    finally:
        taken.close()


async def test_an_address_this_host_does_not_have_is_skipped_and_said(
    resolves_to: list[binding.Address],
) -> None:
    """Where IPv6 is off, ::1 cannot be bound (and nobody can connect to it): the others
    serve, and the skipped one is reported with its reason."""
    resolves_to += [ABSENT, V4]
    bound = await bind_all(HostPort("dual.test", 0), 16)
    try:
        assert bound.addresses() == [f"127.0.0.1:{bound.port}"]
        assert [address for address, _ in bound.skipped] == ["192.0.2.1:0"]
        assert "assign" in bound.skipped[0][1]  # EADDRNOTAVAIL: cannot assign requested address
    finally:
        bound.close()


async def test_a_name_with_no_address_of_this_host_is_refused(
    resolves_to: list[binding.Address],
) -> None:
    resolves_to += [ABSENT]
    with pytest.raises(AddressError, match="resolves to no address this host has"):
        await bind_all(HostPort("dual.test", 4040), 16)


async def test_a_name_that_does_not_resolve_is_refused() -> None:
    with pytest.raises(AddressError, match=r"nosuch\.invalid does not resolve"):
        await bind_all(HostPort("nosuch.invalid", 4040), 16)


async def test_each_address_is_bound_once_however_often_it_resolves(
    resolves_to: list[binding.Address],
) -> None:
    resolves_to += [V4, V4]
    bound = await bind_all(HostPort("dual.test", 0), 16)
    try:
        assert len(bound.sockets) == 1
    finally:
        bound.close()


@pytest.mark.parametrize("flag", ["--listen", "--public-listen"])
def test_a_listen_name_that_names_nothing_here_exits_2_naming_the_flag(
    tmp_path: Path, flag: str
) -> None:
    """A real sidecar: one line naming the flag, the value and why, then exit status 2 (a
    configuration error, not the exit 1 of a busy port)."""
    other = "--public-listen" if flag == "--listen" else "--listen"
    result = run_cli(
        "--store", f"sqlite:///{tmp_path / 'leases.db'}", other, "127.0.0.1:0",
        flag, "nosuch.invalid:4040",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"leader-sidecar: {flag}=nosuch.invalid:4040: "), last
    assert "does not resolve" in last
