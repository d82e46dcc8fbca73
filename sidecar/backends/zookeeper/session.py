"""One ZooKeeper session over asyncio: connect to one server of the ensemble, keep the session
alive with pings, send requests and match their answers, hand watch events on, and connect
again (to the next server) when the connection breaks.

What a caller must know:

* **A session can expire.** The server forgets a session it has not heard from for the
  session timeout; the next connection is told so, and this client then starts a new session
  (``on_connected(new_session=True)``). Every watch of the old one is gone: the caller arms
  them again and reads everything anew before it trusts what it saw.
* **Every (re)connection is announced** (``on_connected``) before any answer on the new
  connection is read: the caller arms its watches there first, so that no change after the
  read that follows goes unseen.
* **Events come in order** with the answers on one connection: ZooKeeper sends a watch event
  before the answer to any later request that sees the change.
* **A server that has seen less than this client** (an ensemble restored from an older
  snapshot, or wiped) refuses the session: after every server refused twice in a row, the
  client forgets what it saw (session and last zxid) and starts anew. A server without a
  quorum refuses it the same way, and never serves: nothing is lost by starting anew there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sidecar.backends.zookeeper import jute
from sidecar.logs import log

if TYPE_CHECKING:
    import ssl as ssl_module

logger = logging.getLogger("sidecar.zookeeper")

PROTOCOL_VERSION = 0
MAX_PACKET = 16 * 1024 * 1024  # the server's jute.maxbuffer is 1 MiB by default


class ZkError(Exception):
    """The server answered a request with an error code."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(f"{what}: {jute.error_name(code)}")
        self.code = code


class ConnectionLost(Exception):
    """No answer: the connection broke (or none could be made) before the request was
    answered, or the request timeout passed. Whether a write was applied is not known."""


EventHandler = Callable[[int, str], None]
ConnectedHandler = Callable[[bool], None]


class ZkSession:
    """One session, on one connection at a time, to one of ``hosts``."""

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        *,
        session_timeout: float,
        request_timeout: float,
        on_event: EventHandler,
        on_connected: ConnectedHandler,
        auth: Sequence[tuple[str, bytes]] = (),
        describe: str = "zookeeper",
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.hosts = list(hosts)
        random.shuffle(self.hosts)  # sidecars spread over the ensemble
        self.session_timeout = session_timeout
        self.request_timeout = request_timeout
        self.on_event = on_event
        self.on_connected = on_connected
        self.auth = list(auth)
        self.describe = describe
        self.ssl = ssl  # the servers' secure client port (zookeepers://)
        self.session_id = 0
        self.password = b"\0" * 16
        self.last_zxid = 0
        self.negotiated_timeout = session_timeout
        self.connections = 0  # connections made (tests count reconnects)
        self.sessions = 0  # sessions started (tests count expiries)
        self.sent: Counter[int] = Counter()  # requests sent, by opcode (tests count reads)
        self._xid = 0
        self._pending: dict[int, tuple[int, asyncio.Future[jute.Reader]]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._connected = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._next_host = 0
        self._refused = 0
        self.problem: str | None = None
        self.server: tuple[str, int] | None = None  # the server of the current connection

    # -- requests ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def call(self, opcode: int, body: jute.Writer, what: str) -> jute.Reader:
        """Send one request and wait for its answer, at most the request timeout in all
        (connecting included). Raises `ZkError` (an answer with an error code) or
        `ConnectionLost`."""
        (answer,) = await self.calls(((opcode, body, what),))
        if isinstance(answer, ZkError):
            raise answer
        return answer

    async def calls(
        self, requests: Sequence[tuple[int, jute.Writer, str]]
    ) -> list[jute.Reader | ZkError]:
        """Send ``requests`` (opcode, body, what) back to back on one connection and wait for
        every answer: one round trip. The server handles a session's requests in the order
        sent, each after the writes sent before it. Each answer, or its `ZkError`, in order;
        raises `ConnectionLost` when any is not answered within the request timeout."""
        self.start()
        futures: list[asyncio.Future[jute.Reader]] = []
        xids: list[int] = []
        what = ", ".join(dict.fromkeys(request[2] for request in requests))
        try:
            async with asyncio.timeout(self.request_timeout):
                await self._connected.wait()
                writer = self._writer
                if writer is None:
                    raise ConnectionLost(f"{what}: not connected")
                loop = asyncio.get_running_loop()
                for opcode, body, _what in requests:
                    self._xid = self._xid + 1 if self._xid < 2**31 - 1 else 1
                    future: asyncio.Future[jute.Reader] = loop.create_future()
                    self._pending[self._xid] = (opcode, future)
                    xids.append(self._xid)
                    futures.append(future)
                    packet = jute.Writer().int32(self._xid).int32(opcode)
                    packet.parts.extend(body.parts)
                    writer.write(packet.packet())
                    self.sent[opcode] += 1
                answers: list[jute.Reader | ZkError] = []
                for future in futures:
                    try:
                        answers.append(await future)
                    except ZkError as error:
                        answers.append(error)
        except TimeoutError:
            raise ConnectionLost(
                f"{what}: no answer within {self.request_timeout:g}s"
                + (f" ({self.problem})" if self.problem else "")
            ) from None
        finally:
            for xid in xids:
                self._pending.pop(xid, None)
            for future in futures:  # those not awaited: a connection lost fails them all
                if future.done() and not future.cancelled():
                    future.exception()
                else:
                    future.cancel()
        return answers

    async def close(self) -> None:
        """End the session on the server (a courtesy: it would expire anyway) and stop."""
        if self._closed:
            return
        if self._connected.is_set() and self._writer is not None:
            with contextlib.suppress(ConnectionLost, ZkError, OSError):
                async with asyncio.timeout(min(1.0, self.request_timeout)):
                    await self.call(jute.CLOSE, jute.Writer(), "close session")
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop("closed")

    # -- the connection loop ----------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closed:
            host, port = self.hosts[self._next_host % len(self.hosts)]
            self._next_host += 1
            try:
                await self._serve(host, port)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken connection, a bad answer: try the next one
                self._note_problem(f"{host}:{port}: {type(exc).__name__}: {exc}")
            finally:
                self._drop("connection lost")
            if self._next_host % len(self.hosts) == 0:
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(1.0, backoff * 2)

    def _note_problem(self, problem: str) -> None:
        if problem != self.problem:
            log(logger, "warning", "zookeeper connection lost", store=self.describe, error=problem)
        self.problem = problem

    async def _serve(self, host: str, port: int) -> None:
        connect_timeout = max(0.5, min(self.request_timeout, self.session_timeout / 2))
        async with asyncio.timeout(connect_timeout):
            stream, writer = await asyncio.open_connection(host, port, ssl=self.ssl)
        try:
            async with asyncio.timeout(connect_timeout):
                request = (
                    jute.Writer()
                    .int32(PROTOCOL_VERSION)
                    .int64(self.last_zxid)
                    .int32(int(self.session_timeout * 1000))
                    .int64(self.session_id)
                    .buffer(self.password)
                    .boolean(False)
                )
                writer.write(request.packet())
                try:
                    answer = jute.Reader(await _read_packet(stream))
                except (asyncio.IncompleteReadError, ConnectionResetError):
                    # A reset too: a proxy or load balancer passes a server's close on as one.
                    self._refused_by_server(host, port)
                    raise
            self._refused = 0
            answer.int32()  # protocol version
            timeout_ms = answer.int32()
            session_id = answer.int64()
            password = answer.buffer() or b""
            if timeout_ms <= 0 or session_id == 0:
                log(logger, "warning", "zookeeper session expired", store=self.describe)
                self.session_id, self.password = 0, b"\0" * 16
                writer.close()
                return  # connect again at once with a new session
            new_session = session_id != self.session_id
            self.session_id, self.password = session_id, password
            self.negotiated_timeout = timeout_ms / 1000
            self.connections += 1
            if new_session:
                self.sessions += 1
            for scheme, credential in self.auth:
                packet = jute.Writer().int32(jute.AUTH_XID).int32(jute.AUTH)
                packet.parts.extend(jute.auth(scheme, credential).parts)
                writer.write(packet.packet())
            self._writer = writer
            self.server = (host, port)
            self._connected.set()
            if self.problem is not None:
                log(logger, "info", "zookeeper connected again", store=self.describe)
                self.problem = None
            self.on_connected(new_session)
            await self._read_loop(stream, writer)
        finally:
            writer.close()

    def _refused_by_server(self, host: str, port: int) -> None:
        """The server closed the connection without answering the handshake: it has seen
        less than we have (a restore, a wiped ensemble), or it does not serve (no quorum)."""
        self._refused += 1
        if self._refused >= 2 * len(self.hosts) and (self.session_id or self.last_zxid):
            log(
                logger,
                "warning",
                "every zookeeper server refused this session: starting anew",
                store=self.describe,
            )
            self.session_id, self.password = 0, b"\0" * 16
            self.last_zxid = 0
            self._refused = 0

    async def _read_loop(self, stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout = self.negotiated_timeout
        ping_every = timeout / 3
        silent_for = timeout * 2 / 3
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        last_ping = loop.time()
        while True:
            now = loop.time()
            if now - last_ping >= ping_every:
                writer.write(jute.Writer().int32(jute.PING_XID).int32(jute.PING).packet())
                last_ping = now
            wait = min(ping_every - (now - last_ping), silent_for - (now - last_heard))
            try:
                async with asyncio.timeout(max(0.01, wait)):
                    data = await _read_packet(stream)
            except TimeoutError:
                if loop.time() - last_heard >= silent_for:
                    raise ConnectionLost(f"the server was silent for {silent_for:.2f}s") from None
                continue
            last_heard = loop.time()
            self._dispatch(jute.Reader(data))

    def _dispatch(self, reader: jute.Reader) -> None:
        xid, zxid, err = reader.int32(), reader.int64(), reader.int32()
        if zxid > 0:
            self.last_zxid = max(self.last_zxid, zxid)
        if xid == jute.PING_XID:
            return
        if xid == jute.AUTH_XID:
            if err != jute.OK:
                self._note_problem(f"authentication refused: {jute.error_name(err)}")
            return
        if xid == jute.WATCH_XID:
            event, _state, path = reader.int32(), reader.int32(), reader.string()
            self.on_event(event, path)
            return
        entry = self._pending.pop(xid, None)
        if entry is None:
            return
        opcode, future = entry
        if future.done():
            return
        if err != jute.OK and not (opcode == jute.MULTI and reader.left):
            future.set_exception(ZkError(err, "request"))
        else:
            future.set_result(reader)

    def _drop(self, why: str) -> None:
        self._connected.clear()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        pending, self._pending = self._pending, {}
        for _opcode, future in pending.values():
            if not future.done():
                future.set_exception(ConnectionLost(why))


async def _read_packet(stream: asyncio.StreamReader) -> bytes:
    header = await stream.readexactly(4)
    size = int.from_bytes(header, "big", signed=True)
    if not 0 <= size <= MAX_PACKET:
        raise ValueError(f"a packet of {size} bytes")
    return await stream.readexactly(size)
