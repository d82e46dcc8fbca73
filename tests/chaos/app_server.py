"""The tiny app beside a chaos slot's sidecar: an HTTP health endpoint on loopback that the
sidecar checks with ``--app-health-url``. Standard library only, so it starts in a blink.

    python3 tests/chaos/app_server.py MODE_FILE [PORT]

It binds 127.0.0.1:PORT (0: any free port; a restarted app asks for its old one, so the
sidecar's URL stays right), prints ``listening PORT`` on stdout, and answers every request
with 200 or 503 as the mode file says *at that moment* (re-read whenever it changes):

* ``{"kind": "up"}``: 200; ``{"kind": "down"}``: 503 (running but unready);
* ``{"kind": "flap", "origin": T, "down": D, "up": U}``: 503 for D seconds, then 200 for U
  seconds, over and over from wall-clock time T (the harness computes the same from the same
  numbers: `tests.chaos.apps.AppMode.up_at`).

Killed (SIGKILL) it refuses connections; stopped (SIGSTOP) the kernel still accepts them and
nothing answers, so a health check times out: the two ways an app dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time

BIND_ATTEMPTS = 50  # a restart on its old port: TIME_WAIT is no obstacle, another owner is


class Mode:
    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp: tuple[int, int] | None = None
        self.spec: dict[str, float | str] = {"kind": "up"}

    def status(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self.stamp:
                with open(self.path) as file:
                    self.spec = json.load(file)
                self.stamp = stamp
        spec = self.spec
        if spec["kind"] == "up":
            return 200
        if spec["kind"] == "flap":
            down, up = float(spec["down"]), float(spec["up"])
            phase = (time.time() - float(spec["origin"])) % (down + up)
            return 503 if phase < down else 200
        return 503


async def serve(mode: Mode, port: int) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await reader.readuntil(b"\r\n\r\n")  # the request line and headers; no body
            status = mode.status()
            reason = b"OK" if status == 200 else b"Service Unavailable"
            body = b"up\n" if status == 200 else b"down\n"
            writer.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (status, reason, len(body), body)
            )
            await writer.drain()
        writer.close()

    for attempt in range(BIND_ATTEMPTS):
        try:
            server = await asyncio.start_server(answer, "127.0.0.1", port, reuse_address=True)
            break
        except OSError:
            if attempt == BIND_ATTEMPTS - 1:
                raise
            await asyncio.sleep(0.1)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    path = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    asyncio.run(serve(Mode(path), port))


if __name__ == "__main__":
    main()
