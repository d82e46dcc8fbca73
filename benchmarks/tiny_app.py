"""The app beside a sidecar in `benchmarks.app_failover`: an HTTP server on loopback whose every
``GET`` answers 200, or 503 ("unready") between SIGUSR1 and SIGUSR2. The harness kills it
(SIGKILL), hangs it (SIGSTOP: connections wait in the listen backlog, unanswered) or makes it
unready; standard library only, so it starts in a few tens of milliseconds.

    python -m benchmarks.tiny_app --port 8080
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class _State:
    ready = True


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = (200, b"ok\n") if _State.ready else (503, b"unready\n")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per health check on stderr is noise


def _set_ready(ready: bool) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        _State.ready = ready

    return handler


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, _set_ready(False))
    signal.signal(signal.SIGUSR2, _set_ready(True))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
