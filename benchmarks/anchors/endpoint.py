"""The anchors' ``/leader``: raw asyncio HTTP/1.1, no web framework, so the anchors' footprint
is the elector's own. The answer says what the process believes at request time."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime


def iso_ms(moment: float) -> str:
    """Same format as the sidecar's ``since``: ``2026-11-29T09:00:00.123Z``."""
    stamp = datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class LeaderState:
    """What the anchor believes, and how many store requests it has made."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.leader = False
        self.since: float | None = None
        self.store_requests = 0

    def lead(self) -> None:
        if not self.leader:
            self.leader = True
            self.since = time.time()

    def follow(self) -> None:
        if self.leader:
            self.leader = False
            self.since = time.time()

    def body(self) -> bytes:
        return json.dumps(
            {
                "leader": self.leader,
                "identity": self.identity,
                "since": iso_ms(self.since) if self.since else None,
                "store_requests": self.store_requests,
            },
            separators=(",", ":"),
        ).encode()


async def serve(state: LeaderState, port: int) -> asyncio.Server:
    """Answer ``GET /leader`` on 127.0.0.1 (keep-alive), then print the ready line."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                body = state.body()
                status = "200 OK" if state.leader else "503 Service Unavailable"
                head = (
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    address = server.sockets[0].getsockname()
    line = {"listening": f"{address[0]}:{address[1]}", "identity": state.identity}
    print(json.dumps(line), flush=True)
    sys.stdout.flush()
    return server
