"""One listener: its sockets (one per address its host resolves to, `sidecar.binding`), an
accept loop on each, and the limits in front of an aiohttp runner.

We accept connections ourselves instead of through ``TCPSite`` for two reasons. asyncio's own
accept loop, out of file descriptors (EMFILE), logs an error for every retry and schedules a
retry per attempt, so a connection flood turned into ~10,000 log lines a second; ours backs off
and logs once in a while. And a connection past ``--max-connections`` gets a ready-made ``503``
and is closed before aiohttp spends anything on it. Each accepted connection is a
`sidecar.connection.Connection` in front of aiohttp's handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import resource
import socket
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from sidecar.api_shared import EVENT_STREAMS, LONG_POLLS
from sidecar.binding import Bound, bind_all
from sidecar.connection import Connection
from sidecar.limits import RETRY_AFTER_SECONDS, Limits
from sidecar.logs import Throttle, log
from sidecar.options import HostPort

logger = logging.getLogger("sidecar.listener")

BACKLOG = 512  # a burst waits in the kernel for its fast 503 instead of SYN retries
MAX_LINE_BYTES = 8190  # request line (and so the URL); aiohttp's default, stated on purpose
MAX_HEADER_BYTES = 8190  # one header field
MAX_HEADERS = 64  # a probe or a scrape sends fewer than 10
LINGER_SECONDS = 1.0  # reading an unread request body after the answer, before closing

# Out of descriptors or kernel memory: the condition passes when connections close, so wait.
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BACKOFF_MIN = 0.05
ACCEPT_BACKOFF_MAX = 1.0
# At the connection limit, a connection quiet this long (no request held, none received and
# no answer sent) may be closed to make room. Shorter would let a flood of fresh connections
# churn through the slots (memory, CPU).
EVICT_IDLE_SECONDS = 1.0

_BUSY_BODY = b'{"error": "too many connections to this listener; retry later"}\n'
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: " + str(RETRY_AFTER_SECONDS).encode() + b"\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class RequestErrorLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The logger aiohttp's request handler writes to. A request aiohttp cannot parse is the
    client's problem, not ours: one debug line at most every few seconds, no traceback, so
    garbage sent to the public port cannot flood the log. Errors in our own handlers still
    log at error level with their traceback."""

    def __init__(self, logger: logging.Logger, throttle: Throttle | None = None) -> None:
        super().__init__(logger, {})
        self.throttle = throttle or Throttle()

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._malformed(exc_info)
        else:
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._malformed(exc_info)
        else:
            self.logger.debug(msg, *args, exc_info=exc_info, **kwargs)

    def _malformed(self, error: HttpProcessingError) -> None:
        if self.throttle.allow():
            log(
                self.logger,
                "debug",
                "malformed request refused",
                status=error.code,
                error=type(error).__name__,
                suppressed=self.throttle.take_suppressed(),
            )


def handler_args(limits: Limits) -> dict[str, Any]:
    """aiohttp's own knobs for every connection (passed to ``AppRunner``/``TestServer``)."""
    return {
        "keepalive_timeout": limits.idle_timeout,
        "logger": RequestErrorLog(logging.getLogger("sidecar.http")),
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_HEADER_BYTES,
        "max_headers": MAX_HEADERS,
        "lingering_time": LINGER_SECONDS,
    }


RESERVED_FILES = 64  # the store, the log, the event loop, the interpreter's own


def open_files_shortfall(limits: Limits, listeners: int = 2) -> int | None:
    """How far RLIMIT_NOFILE falls short of every listener at its connection limit plus what
    the rest of the process needs; None when it does not. Short means the limits no longer
    protect the store's own connections from a flood (accept then backs off instead)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = listeners * limits.max_connections + RESERVED_FILES
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    return needed - soft


class Listener:
    """``start`` binds and accepts; ``stop`` stops accepting (the runner closes connections)."""

    def __init__(self, name: str, app: web.Application, where: HostPort, limits: Limits) -> None:
        self.name = name
        self.where = where
        self.limits = limits
        self.runner = self._runner(app)
        self._retired: list[web.AppRunner] = []  # the apps served before (`serve`)
        self.connections: dict[asyncio.BaseTransport, Connection] = {}
        self.admitted = 0  # accepted and not yet closed, including those being set up
        self.refused = 0  # connections answered 503 at the ceiling
        self.evicted = 0  # idle connections closed at the ceiling to make room
        self.slow_closed = 0  # connections closed for not sending a request head in time
        self.accept_errors = 0
        self.bound: Bound | None = None
        self._accepting: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[Any]] = set()
        self._accept_log = Throttle()

    def _runner(self, app: web.Application) -> web.AppRunner:
        return web.AppRunner(
            app, access_log=None, shutdown_timeout=0.2, **handler_args(self.limits)
        )

    def usage(self) -> dict[str, int]:
        """Counters for the SIGUSR1 state dump."""
        app = self.runner.app
        return {
            "connections": len(self.connections),
            "max_connections": self.limits.max_connections,
            "refused_connections": self.refused,
            "evicted_idle": self.evicted,
            "closed_idle": self.slow_closed,
            "accept_errors": self.accept_errors,
            "long_polls": app[LONG_POLLS].in_use,
            "refused_long_polls": app[LONG_POLLS].refused,
            "refused_long_polls_per_peer": app[LONG_POLLS].refused_per_peer,
            "event_streams": app[EVENT_STREAMS].in_use,
            "refused_event_streams": app[EVENT_STREAMS].refused,
        }

    @property
    def address(self) -> HostPort:
        assert self.bound is not None
        return HostPort(self.where.host, self.bound.port)

    async def start(self) -> HostPort:
        """Listen on every address of ``where``; raises `sidecar.binding.AddressError` for an
        address that names nothing here, `OSError` for one that cannot be bound."""
        await self.runner.setup()
        self.bound = await bind_all(self.where, BACKLOG)
        self._accepting = [
            asyncio.create_task(self._accept_forever(sock), name=f"accept-{self.name}")
            for sock in self.bound.sockets
        ]
        return self.address

    async def serve(self, app: web.Application) -> None:
        """Answer every new connection with ``app`` from now on. A connection accepted before
        is left to the app it was given to, to be answered (the start-up app of
        `sidecar.starting_api` closes each after its answer): closing it now could drop a
        request on its way. That app's runner is cleaned up with the listener."""
        runner = self._runner(app)
        await runner.setup()
        self._retired.append(self.runner)
        self.runner = runner

    async def stop(self) -> None:
        tasks = [*self._accepting, *self._pending]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.bound is not None:
            self.bound.close()
        await self.runner.cleanup()
        for runner in self._retired:
            await runner.cleanup()

    async def _accept_forever(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        backoff = ACCEPT_BACKOFF_MIN
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client gave up while waiting in the backlog
                self.accept_errors += 1
                if self._accept_log.allow():
                    log(
                        logger,
                        "warning",
                        "cannot accept connections; backing off",
                        listener=self.name,
                        error=exc.strerror or str(exc),
                        open_connections=len(self.connections),
                        suppressed=self._accept_log.take_suppressed(),
                    )
                # Out of descriptors clears when connections close: wait, doubling the pause.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX)
                continue
            backoff = ACCEPT_BACKOFF_MIN
            self._admit(conn)
            # sock_accept returns without yielding while the backlog is full: give the
            # election task its turn between connections, or a flood starves renewals.
            await asyncio.sleep(0)

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        if self.admitted >= self.limits.max_connections and not self._evict_one_idle():
            self.refused += 1
            _refuse(conn)
            return
        server = self.runner.server
        assert server is not None
        # Counted from here until its connection_lost (or a failed set-up), so that sockets
        # still being wrapped count too, and none twice.
        self.admitted += 1
        protocol = Connection(server(), self)
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: protocol, conn))
        self._pending.add(task)
        task.add_done_callback(functools.partial(self._connected, protocol))

    def _evict_one_idle(self) -> bool:
        """At the limit, make room by closing the oldest connection that has had no request
        in progress for `EVICT_IDLE_SECONDS` (idle keep-alive, or a request head still
        arriving). Connections held open by a flood then cannot lock the kubelet's probes or
        Prometheus out; a newcomer gets the 503 only while every connection is busy or new."""
        quiet_since = asyncio.get_running_loop().time() - EVICT_IDLE_SECONDS
        for connection in self.connections.values():  # in the order they connected
            if connection.made_at > quiet_since:
                break  # this one and every later one are too new: a fresh flood gets the 503
            if connection.quiet_since(quiet_since) and connection.close_for_room():
                self.evicted += 1
                return True
        return False

    def _connected(self, protocol: Connection, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        failed = task.cancelled() or task.exception() is not None
        if failed and not protocol.made:  # asyncio closed the socket; no connection_lost
            self.admitted -= 1
        if not task.cancelled() and task.exception() is not None:
            log(logger, "debug", "connection setup failed", error=str(task.exception()))


def _refuse(conn: socket.socket) -> None:
    """Answer 503 without parsing anything, then close. The request already received is read
    away first, so the close is a FIN the client reads after the answer, not a reset."""
    with contextlib.suppress(OSError):
        conn.recv(65536)
    with contextlib.suppress(OSError):
        conn.send(TOO_MANY_CONNECTIONS)
        conn.shutdown(socket.SHUT_WR)
    conn.close()
