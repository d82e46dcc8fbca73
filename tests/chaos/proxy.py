"""A small asyncio TCP proxy between one sidecar and its store, so that one replica alone can
be cut off from a store every replica shares.

Modes:

* ``open``: bytes flow both ways.
* ``blackhole``: connections stay up and new ones are accepted, but no byte moves in either
  direction; what arrives is held and delivered in order when the proxy opens again (a
  network that silently drops packets until a retransmission gets through). The client sees
  only timeouts.
* ``reset``: every open connection is closed at once (RST) and new ones are accepted and
  reset immediately, as a firewall rejecting the flow would. The client sees errors at once.

A side that closes its connection cleanly (FIN) is passed on as a clean close, a reset as a
reset: a server that turns a client away by closing (ZooKeeper refusing a session it has
seen less than) must look the same through the proxy as without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Literal

Mode = Literal["open", "blackhole", "reset"]
_CHUNK = 65536


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, name: str = "proxy") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.name = name
        self.mode: Mode = "open"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "open":
            self._open.set()
        else:
            self._open.clear()
        if mode == "reset":
            self._reset_all()

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            _abort(writer)
            return
        self._writers.add(writer)
        try:
            # While black-holed the upstream connection is not even attempted: nothing leaves.
            await self._open.wait()
            if self.mode != "open" or writer not in self._writers:
                _abort(writer)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), 5
                )
            except (OSError, TimeoutError):
                _abort(writer)  # the store is down: the client sees a reset, as it would
                return
            self._writers.add(up_writer)
            pumps = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            self._tasks.update(pumps)
            clean = False
            try:
                done, _pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                clean = any(
                    not p.cancelled() and p.exception() is None and p.result() for p in done
                )
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                self._tasks.difference_update(pumps)
                for end in (writer, up_writer):
                    self._writers.discard(end)
                    if clean and self.mode == "open":
                        end.close()
                    else:
                        _abort(end)
        finally:
            self._writers.discard(writer)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> bool:
        """Bytes from ``source`` to ``sink`` until one side ends; True when ``source`` closed
        cleanly (and the close may be passed on as one)."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await source.read(_CHUNK)
                # Held, not dropped, while black-holed (a close too); a reset meanwhile ends
                # the pump.
                await self._open.wait()
                if sink not in self._writers:
                    return False
                if not data:
                    return True
                sink.write(data)
                await sink.drain()
        return False


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a rejecting firewall or a crashed peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport = writer.transport
    with contextlib.suppress(Exception):
        transport.abort()
