"""A tiny forward HTTP proxy for the proxy tests: ``CONNECT host:port`` tunnels (what a client
sends for an ``https://`` server) and absolute-form requests (``GET http://host:port/…``, for
an ``http://`` server), every host name resolved to 127.0.0.1 — so a test can use a name no
DNS knows (``kube.test``) and still reach a local server, but only through the proxy.

It records each connection's first request line and its ``Proxy-Authorization`` header, then
pipes bytes both ways (the servers here read absolute-form request lines as well as
origin-form ones, so keep-alive requests after the first pass through unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator


@dataclasses.dataclass
class Seen:
    request_line: str
    proxy_authorization: str | None


class ForwardProxy:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        }
        self.seen.append(Seen(lines[0], headers.get("proxy-authorization")))
        if method == "CONNECT":
            _host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            authority = target.split("://", 1)[1].split("/", 1)[0]
            port = int(authority.rpartition(":")[2]) if ":" in authority else 80
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()


@contextlib.asynccontextmanager
async def forward_proxy() -> AsyncIterator[ForwardProxy]:
    proxy = ForwardProxy()
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
