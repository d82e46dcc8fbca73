"""``python -m tests.fakekube``: run the fake API server in its own process.

Prints one JSON line ``{"url": ..., "control_url": ..., "pid": ...}`` on stdout once both
listeners are up, then serves until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from tests.fakekube.server import FakeApiServer


async def serve(args: argparse.Namespace) -> None:
    fake = FakeApiServer()
    for namespace in args.namespace:
        fake.cluster.namespaces.add(namespace)
    await fake.start(args.host, args.port, args.control_port)
    print(
        json.dumps({"url": fake.url, "control_url": fake.control_url, "pid": _pid()}),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await fake.stop()


def _pid() -> int:
    import os

    return os.getpid()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakekube")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument("--namespace", action="append", default=[], help="extra namespace")
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
