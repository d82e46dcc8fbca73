"""A wiped ensemble refuses the session a client had: the client must notice and start anew,
also when a proxy or load balancer between them turns the server's close into a reset."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import tempfile
from pathlib import Path

import pytest

from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.target import parse_target
from tests.support.waiting import eventually
from tests.zookeeper.servers import Standalone

pytestmark = pytest.mark.slow


class ResettingProxy:
    """Forwards bytes both ways; when the server closes a connection, resets the client's
    side (RST) instead of closing it — as many proxies and load balancers do."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> ResettingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            self._reset(writer)
            return
        upward = asyncio.create_task(self._pipe(reader, up_writer))
        try:
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            upward.cancel()
            self._reset(writer)
            up_writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()

    @staticmethod
    def _reset(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


async def test_a_wiped_ensemble_behind_a_resetting_proxy_gets_a_new_session() -> None:
    """The server refuses the old session (it knows nothing of it, and the client has seen a
    newer zxid) by closing the connection; the proxy passes that on as a reset. Counted as a
    refusal like a clean close, so the client starts anew within a few tries — before, it
    retried the old session for ever, and no lease on it could be read or written again."""
    with tempfile.TemporaryDirectory(prefix="zookeeper-refusal-") as tmp:
        server = Standalone.start(Path(tmp))
        proxy = await ResettingProxy(server.client_port).start()
        client = ZooKeeperStoreClient(
            parse_target(f"zookeeper://127.0.0.1:{proxy.port}/refusal"), request_timeout=1.0
        )
        try:
            granted = await client.lease("l").try_acquire("a_1", 5.0, 0, expected=None)
            for _ in range(5):  # the client's last zxid well above an empty server's
                await client.lease("l").renew("a_1", granted.term, 5.0)
            sessions = client.session.sessions
            await asyncio.to_thread(server.wipe)
            await asyncio.to_thread(server.launch)
            await asyncio.to_thread(server.wait_serving)
            await eventually(lambda: client.session.sessions > sessions, timeout=10)
            assert client.session.sessions == sessions + 1
            assert await client.lease("l").read() is None  # the wiped store, readable again
        finally:
            await client.close()
            await proxy.stop()
            server.kill()
