"""One accepted connection, between its transport and aiohttp's request handler, and what a
handler may ask of it.

The connection is counted while it is open, closed if no complete request head arrives within
the idle timeout (slowloris; after the first request aiohttp's keep-alive timeout takes over),
and knows whether it is quiet, so that a listener at its limit can close a quiet one to make
room (`sidecar.listener`). This is done below aiohttp rather than in a middleware: any
middleware puts two more layers on every request (ours and the one aiohttp adds to set the
current app): ~3.5 µs a request, near a tenth of a ``GET /leader``.

A handler that waits (a long-poll, an event stream, a request to the store) says so with
`held`: the connection is then never closed to make room, and the handler learns when the
client goes away. Every other answer is written within a few turns of the loop after its
request head arrived, and a connection that completed a request head or was answered within
the last `sidecar.listener.EVICT_IDLE_SECONDS` is never closed to make room either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

from aiohttp import web

from sidecar.limits import Limits


class Counts(Protocol):
    """What a connection keeps up to date on its listener (`sidecar.listener.Listener`)."""

    limits: Limits
    connections: dict[asyncio.BaseTransport, Connection]
    admitted: int  # accepted and not yet closed
    slow_closed: int  # closed for not sending a request head in time


class Connection(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, listener: Counts) -> None:
        self.inner = inner
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.BaseTransport | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        # The end of a request head is an empty line (CRLF CRLF, or LF LF, which parsers accept
        # too), found even when it arrives split across reads: the last two bytes of a read
        # that did not end a head are kept.
        self._head_tail = b""
        self.made = False
        self.held = 0  # requests in progress that said they wait (`held`)
        self.made_at = float("inf")  # loop time of connecting
        self.active_at = float("inf")  # loop time of connecting, of the last head, or answer
        self.evicted = False
        # Set when the client goes away: a handler holding its request (a long-poll) stops
        # waiting and frees its slot (`sidecar.api`), instead of waiting out its ``wait=``.
        self.gone = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        self._transport = transport
        self.made_at = self.active_at = self._loop.time()
        self._head_timer = self._loop.call_later(self._listener.limits.idle_timeout, self._too_slow)
        self._listener.connections[transport] = self
        self.inner.connection_made(transport)

    def quiet_since(self, moment: float) -> bool:
        """Nothing held, and no request head completed nor answer sent since ``moment``:
        closing it loses nothing but a kept-alive connection or a head still trickling in."""
        return not self.held and self.active_at <= moment

    def hold(self) -> asyncio.Event:
        self.held += 1
        return self.gone

    def let_go(self) -> None:
        self.held -= 1
        self.active_at = self._loop.time()  # its answer is on its way

    def close_for_room(self) -> bool:
        """Abort this connection now and stop counting it (its connection_lost follows)."""
        if not isinstance(self._transport, asyncio.Transport) or self.evicted:
            return False
        self.evicted = True
        self._listener.admitted -= 1
        self._transport.abort()
        return True

    def _too_slow(self) -> None:
        self._head_timer = None
        self._listener.slow_closed += 1
        if isinstance(self._transport, asyncio.Transport):
            self._transport.abort()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        # Activity is a read that ends a request head (or, harmlessly, holds an empty line of
        # a body); a head still arriving is not: bytes trickled in must not keep a connection
        # from being closed to make room. (Inline: this runs for every request.)
        seen = self._head_tail + data if self._head_tail else data
        if b"\n\r\n" in seen or b"\n\n" in seen:
            self._head_tail = b""
            self.active_at = self._loop.time()
            if self._head_timer is not None:
                self._stop_head_timer()
        else:
            self._head_tail = seen[-2:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone.set()
        self._stop_head_timer()
        self._listener.connections.pop(self._transport, None)  # type: ignore[arg-type]
        if not self.evicted:  # an evicted one stopped counting when it was chosen
            self._listener.admitted -= 1
        self.inner.connection_lost(exc)


def connection_of(request: web.Request) -> Connection | None:
    """The connection ``request`` came on; None when not served by a `Listener` (a test
    server) or when it is already closed."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Connection) else None


@contextlib.contextmanager
def held(request: web.Request) -> Iterator[asyncio.Event | None]:
    """For a handler that waits: its connection is not closed to make room while it does.
    Yields the event set when the client goes away (None when not served by a `Listener`)."""
    connection = connection_of(request)
    if connection is None:
        yield None
        return
    gone = connection.hold()
    try:
        yield gone
    finally:
        connection.let_go()


def holding(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`held` for the whole of a handler that waits."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        with held(request):
            return await handler(request)

    return run
