"""Listening sockets for a ``HOST:PORT``: one on every address the host name resolves to.

``--listen localhost:4040`` is a promise to every client on this host that looks ``localhost``
up, and ``localhost`` resolves to 127.0.0.1 *and* ::1 on most dual-stack hosts: a client that
tries ::1 first must not find nothing there (or, worse, another program). So every address is
bound, all on one port (with port 0, the port the first one got). An address this host does
not have (::1 where IPv6 is off: ``EADDRNOTAVAIL``, ``EAFNOSUPPORT``) is skipped and said so,
since no client can reach it either; a name that resolves to nothing this host has is a
configuration error, as is one that does not resolve. A port in use is not: that is a busy host,
and the caller reports it as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Sequence

from sidecar.options import HostPort

# An address family or address this host does not have: nothing can connect there.
_ABSENT = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})
# With port 0, the port the first address got may be taken on another: pick again.
_PORT_ATTEMPTS = 8

Address = tuple[socket.AddressFamily, str]


class AddressError(Exception):
    """The host name names nothing this host can listen on. ``str()`` says why."""


class ListenFailed(Exception):
    """A listener could not bind (a port in use, a port below 1024 without the privilege).
    ``str()`` is the one line printed before exiting 1: the flag, the address and the fix."""

    def __init__(self, flag: str, where: HostPort, error: OSError) -> None:
        if error.errno == errno.EADDRINUSE:
            why = (
                "the port is in use (another leader-sidecar on this host? each copy needs its "
                f"own --listen and --public-listen ports); stop that program or pick a free "
                f"port with {flag}"
            )
        elif error.errno == errno.EACCES:
            why = (
                f"not allowed to listen there ({error.strerror}; ports below 1024 need "
                f"privileges); pick a port above 1023 with {flag}"
            )
        else:
            why = (
                f"cannot listen there ({error.strerror or error}); pick another address with {flag}"
            )
        super().__init__(f"{flag}={where}: {why}")


class Bound:
    """The sockets listening for one ``HOST:PORT``, and the addresses skipped."""

    def __init__(self, sockets: list[socket.socket], skipped: list[tuple[str, str]]) -> None:
        self.sockets = sockets
        self.skipped = skipped  # (address, reason) of each address this host does not have

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def addresses(self) -> list[str]:
        """``127.0.0.1:4040``, ``[::1]:4040``: what is listening, for the log."""
        return [str(HostPort(*sock.getsockname()[:2])) for sock in self.sockets]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


async def resolve(where: HostPort) -> list[Address]:
    """Every address ``where.host`` resolves to, in the resolver's order."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            where.host, where.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise AddressError(f"{where.host} does not resolve ({exc.strerror})") from None
    return [(family, str(address[0])) for family, _, _, _, address in infos]


async def bind_all(where: HostPort, backlog: int) -> Bound:
    """Listen on every address ``where.host`` resolves to, all on one port. Raises
    `AddressError` for a name that gives no address this host has, `OSError` otherwise (a
    port in use, a privileged port)."""
    addresses = list(dict.fromkeys(await resolve(where)))  # once each, in the resolver's order
    for _ in range(_PORT_ATTEMPTS):
        try:
            bound = _bind_each(addresses, where.port, backlog)
        except _PortTaken:
            continue
        if not bound.sockets:
            reasons = "; ".join(f"{address}: {reason}" for address, reason in bound.skipped)
            raise AddressError(f"{where.host} resolves to no address this host has ({reasons})")
        return bound
    raise OSError(errno.EADDRINUSE, f"no free port on every address of {where.host}")


class _PortTaken(Exception):
    """Port 0: the port the first address got is in use on another address."""


def _bind_each(addresses: Sequence[Address], port: int, backlog: int) -> Bound:
    any_port = port == 0
    sockets: list[socket.socket] = []
    skipped: list[tuple[str, str]] = []
    try:
        for family, host in addresses:
            try:
                # IPV6_V6ONLY (create_server's default): "::" and "0.0.0.0" can both be bound.
                sock = socket.create_server((host, port), family=family, backlog=backlog)
            except OSError as exc:
                if exc.errno in _ABSENT:
                    skipped.append((str(HostPort(host, port)), exc.strerror or str(exc)))
                    continue
                if exc.errno == errno.EADDRINUSE and sockets and any_port:
                    raise _PortTaken from None
                raise
            sock.setblocking(False)
            sockets.append(sock)
            port = sock.getsockname()[1]
    except BaseException:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        raise
    return Bound(sockets, skipped)
