"""Raw HTTP/1.1 over asyncio streams: for clients no library would be (half-sent requests,
thousands of idle connections, garbage)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*split_address(address))


async def read_head(reader: asyncio.StreamReader, timeout: float) -> Answer:
    """The status and headers of the next answer (the body is left unread)."""
    async with asyncio.timeout(timeout):
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("closed without an answer")
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers)


async def ask(address: str, request: bytes, timeout: float = 5.0) -> Answer:
    reader, writer = await connect(address)
    try:
        writer.write(request)
        await writer.drain()
        return await read_head(reader, timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True once the server closed the connection (EOF or reset), False at ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
