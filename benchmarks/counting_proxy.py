"""A TCP proxy in front of the API server for one process: it counts the HTTP requests that
process sends, by kind, and can play an API server that is down.

One proxy per process (its kubeconfig names the proxy), so every request is counted for the
process that sent it — also those the API server never answers. The client-to-server stream is
read as HTTP/1.1 requests (request line, headers, ``Content-Length`` body); the answers pass
through untouched. Down: every open connection is reset, and every new one is reset as soon as
its request line is in (counted: it is a request a down API server would have refused).

aiohttp (both clients measured use it) sends an idempotent request (GET, PUT, DELETE) once
more, at once, when its connection is reset (RFC 9112's retry of a persistent connection): the
same request line within `RESEND_WINDOW` of a refused one is that resend (a process with several
leases sends several requests at once: the same line, not the last one), counted apart
(``resent``), not as a request of its own — the client decided to send one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import urllib.parse

KINDS = ("list", "watch", "get", "write", "other")
RESEND_WINDOW = 0.1  # seconds


def kind_of(method: str, target: str) -> str:
    """list, watch, get, write (create/update/patch/delete) or other (discovery, …)."""
    parsed = urllib.parse.urlsplit(target)
    if method in ("POST", "PUT", "PATCH", "DELETE"):
        return "write"
    if method != "GET":
        return "other"
    query = urllib.parse.parse_qs(parsed.query)
    if query.get("watch", [""])[0] in ("1", "true"):
        return "watch"
    segments = [s for s in parsed.path.split("/") if s]
    if "namespaces" not in segments:
        return "other"
    after = segments[segments.index("namespaces") + 2 :]  # resource[, name]
    if len(after) == 1:
        return "list"
    return "get" if len(after) == 2 else "other"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed or restarting server's host does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class CountingProxy:
    def __init__(self, name: str, upstream: tuple[str, int]) -> None:
        self.name = name
        self.upstream = upstream
        self.requests: list[tuple[float, str]] = []  # (monotonic time, kind)
        self.resent: list[float] = []  # aiohttp's resends of a refused request (see above)
        self._refused_at: dict[bytes, float] = {}  # request line → when last refused
        self.down = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()  # one per connection, awaited by `close`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def go_down(self) -> None:
        self.down = True
        for writer in list(self._open):
            _reset(writer)
        self._open.clear()

    def come_back(self) -> None:
        self.down = False

    def count(self, kind: str) -> None:
        self.requests.append((time.monotonic(), kind))

    def counted(self, since: float, until: float) -> dict[str, int]:
        """Requests by kind (and ``total``, and ``resent``) sent in [since, until)."""
        counts = dict.fromkeys((*KINDS, "total", "resent"), 0)
        for at, kind in self.requests:
            if since <= at < until:
                counts[kind] += 1
                counts["total"] += 1
        counts["resent"] = sum(since <= at < until for at in self.resent)
        return counts

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._connection(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            await self._refuse(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        self._open.update((writer, up_writer))
        tasks = [
            asyncio.create_task(self._requests(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        try:
            # Either side ending (or failing) ends the connection, as a real server would.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for side in (writer, up_writer):
                self._open.discard(side)
                side.transport.abort()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(0.5):
                line = await reader.readline()
                method, target, _ = line.decode("latin-1").split(" ", 2)
                now = time.monotonic()
                idempotent = method in ("GET", "PUT", "DELETE")
                if idempotent and now - self._refused_at.get(line, float("-inf")) < RESEND_WINDOW:
                    self.resent.append(now)
                else:
                    self.count(kind_of(method, target))
                self._refused_at[line] = now
                if len(self._refused_at) > 1000:  # a process has far fewer distinct lines
                    self._refused_at.clear()
                _reset(writer)
                return
        self.count("other")  # connected, said nothing: still an attempt
        _reset(writer)

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        """Client to server, one HTTP/1.1 request at a time, each counted. Ends when the
        client closes (or sends what is not HTTP/1.1)."""
        with contextlib.suppress(
            OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError
        ):
            await self._each_request(reader, up)

    async def _each_request(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in lines[1:] if line)
            }
            self.count(kind_of(method, target))
            up.write(head)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                await self._pipe(reader, up)  # not sent by these clients; pass it on raw
                return
            length = int(headers.get("content-length", "0") or 0)
            if length:
                up.write(await reader.readexactly(length))
            await up.drain()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.go_down()
        # Every connection is reset: its handler ends by itself (cancelling it instead makes
        # asyncio's stream server log the CancelledError as an error).
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=2.0)
