"""A bare aiohttp handler answering fixed bytes: the ceiling for ``/leader`` throughput.

python -m benchmarks.anchors.bare_leader --body-file F [--header Name:Value ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from aiohttp import web


async def main(args: argparse.Namespace, body: bytes) -> None:
    headers = dict(h.split(":", 1) for h in args.header)

    async def leader(request: web.Request) -> web.Response:
        return web.Response(body=body, status=200, headers=headers)

    app = web.Application()
    app.router.add_get("/leader", leader)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(json.dumps({"listening": f"127.0.0.1:{port}", "identity": "bare"}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--name", default="bare")
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments, Path(arguments.body_file).read_bytes()))
