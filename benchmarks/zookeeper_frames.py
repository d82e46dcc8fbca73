"""A TCP proxy per replica in front of one ZooKeeper server that reads ZooKeeper's wire
protocol on the way through: every frame a client sends (each is one request — a ping, a
read, a write, the connect request — behind a 4-byte length), and the answers to the writes.

ZooKeeper has no HTTP and no request log a harness can read per client (the four-letter words
count per server, or per connection only while it lives), so this is the one counter for both
systems on this store: our sidecar's metrics count operations, kazoo counts nothing, and
neither counts its pings. It also keeps the store's record of writes the measures need: when
each ``create``/``setData`` was answered ``OK`` (the write is applied by then), and which
session created which znode.

The proxies run on an event loop of their own, on a thread, so the harness's observer (polling
every replica every 10 ms) does not delay the frames.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import struct
import threading
import time

# Opcodes (org.apache.zookeeper.ZooDefs.OpCode) this record reads; the rest are only counted.
CREATE, DELETE, SET_DATA, PING, CREATE2 = 1, 2, 5, 11, 15
_PATH_FIRST = {CREATE, DELETE, SET_DATA, CREATE2}  # requests whose body starts with the path
_OP_NAMES = {
    CREATE: "create", DELETE: "delete", 3: "exists", 4: "getData", SET_DATA: "setData",
    8: "getChildren", PING: "ping", 12: "getChildren2", 13: "check", 14: "multi",
    22: "multiRead", CREATE2: "create2", 100: "auth", 101: "setWatches", 105: "setWatches2",
    106: "addWatch", -11: "closeSession",
}  # fmt: skip


def _string(body: bytes, offset: int) -> str | None:
    """A jute string at ``offset``: a 4-byte length (-1: null), then UTF-8."""
    (length,) = struct.unpack_from(">i", body, offset)
    if length < 0:
        return None
    return body[offset + 4 : offset + 4 + length].decode(errors="replace")


@dataclasses.dataclass
class Connection:
    """One client connection through one slot's proxy."""

    slot: str
    opened: float
    closed: float | None = None
    session: int | None = None
    sent: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (time, op)
    pending: dict[int, tuple[int, str | None]] = dataclasses.field(default_factory=dict)

    def open_at(self, moment: float) -> bool:
        return self.opened <= moment and (self.closed is None or self.closed > moment)


@dataclasses.dataclass
class Write:
    at: float  # when the server's OK passed the proxy
    op: str  # create, setData, delete
    path: str  # the znode written (a sequential create's real name)
    connection: Connection


class FrameProxies:
    """One listening proxy per slot (``ours-0``, ``kazoo-1`` …), started on first use."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.connections: list[Connection] = []
        self.writes: list[Write] = []
        self._ports: dict[str, int] = {}
        self._servers: list[asyncio.Server] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    # -- the harness's side (any thread) ------------------------------------------------------

    def endpoint(self, slot: str) -> str:
        """``127.0.0.1:PORT`` of the slot's proxy, started on first use."""
        if slot not in self._ports:
            future = asyncio.run_coroutine_threadsafe(self._listen(slot), self._loop)
            self._ports[slot] = future.result(10)
        return f"127.0.0.1:{self._ports[slot]}"

    def requests(self, slot: str) -> int:
        """Every frame the slot's processes have sent, pings and connect requests included."""
        return sum(len(c.sent) for c in list(self.connections) if c.slot == slot)

    def ops(self, slot_prefix: str) -> collections.Counter[str]:
        """Frames sent through the slots starting with ``slot_prefix``, by request type."""
        counts: collections.Counter[str] = collections.Counter()
        for connection in list(self.connections):
            if connection.slot.startswith(slot_prefix):
                counts.update(op for _, op in list(connection.sent))
        return counts

    def last_write(self, path: str, moment: float) -> float | None:
        """When the last write to ``path`` answered OK at or before ``moment``."""
        return max(
            (w.at for w in list(self.writes) if w.path == path and w.at <= moment and
             w.op != "delete"),
            default=None,
        )  # fmt: skip

    def holder_last_heard(self, parent: str, moment: float) -> float | None:
        """For a lock recipe of ephemeral sequential znodes under ``parent``: the holder at
        ``moment`` is the lowest sequence among the znodes whose session still had a
        connection open then (and that were not deleted by then); the last frame its session
        sent before ``moment``. The server expires that session a session timeout after it."""
        writes = list(self.writes)
        deleted = {w.path for w in writes if w.op == "delete" and w.at <= moment}
        alive = {
            c.session for c in list(self.connections) if c.session is not None and c.open_at(moment)
        }
        held = [
            w
            for w in writes
            if w.op in ("create", "create2")
            and w.path.startswith(parent + "/")
            and w.at <= moment
            and w.path not in deleted
            and w.connection.session in alive
        ]
        if not held:
            return None
        holder = min(held, key=lambda w: w.path[-10:])  # ZooKeeper's 10-digit sequence
        session = holder.connection.session
        return max(
            (
                at
                for c in list(self.connections)
                if c.session == session
                for at, _ in list(c.sent)
                if at <= moment
            ),
            default=None,
        )

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # -- the proxies (their own loop) ------------------------------------------------------------

    async def _listen(self, slot: str) -> int:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(slot, reader, writer)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _connection(
        self, slot: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        connection = Connection(slot, time.time())
        self.connections.append(connection)
        tasks = [
            asyncio.create_task(self._client_frames(connection, reader, up_writer)),
            asyncio.create_task(self._server_frames(connection, up_reader, writer)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            connection.closed = time.time()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for side in (writer, up_writer):
                side.close()

    @staticmethod
    async def _frames(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, each: object
    ) -> None:
        """Pass length-prefixed frames on, calling ``each(body, first)`` on each before."""
        first = True
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, struct.error):
            while True:
                head = await reader.readexactly(4)
                (length,) = struct.unpack(">i", head)
                body = await reader.readexactly(length)
                each(body, first)  # type: ignore[operator]
                first = False
                writer.write(head + body)
                await writer.drain()

    async def _client_frames(
        self, connection: Connection, reader: asyncio.StreamReader, up: asyncio.StreamWriter
    ) -> None:
        def each(body: bytes, first: bool) -> None:
            now = time.time()
            if first:  # ConnectRequest: no request header
                connection.sent.append((now, "connect"))
                return
            xid, op = struct.unpack_from(">ii", body)
            connection.sent.append((now, _OP_NAMES.get(op, str(op))))
            if op in _PATH_FIRST:
                connection.pending[xid] = (op, _string(body, 8))

        await self._frames(reader, up, each)

    async def _server_frames(
        self, connection: Connection, reader: asyncio.StreamReader, down: asyncio.StreamWriter
    ) -> None:
        def each(body: bytes, first: bool) -> None:
            if first:  # ConnectResponse: protocol version, timeout, session id, password
                connection.session = struct.unpack_from(">iiq", body)[2]
                return
            xid, _zxid, err = struct.unpack_from(">iqi", body)
            asked = connection.pending.pop(xid, None)
            if asked is None or err != 0:
                return
            op, path = asked
            if op in (CREATE, CREATE2):
                path = _string(body, 16)  # the created znode's real name
            if path is not None:
                self.writes.append(Write(time.time(), _OP_NAMES[op], path, connection))
                del self.writes[:-50000]

        await self._frames(reader, down, each)
