"""The floor for start-up: a bare aiohttp app with prometheus_client, as any app that serves
HTTP and exports metrics would be, answering one route. Nothing else: no store, no config, no
logging set-up. `benchmarks.start_floor` times it from spawn to its first answer.

    python -m benchmarks.anchors.bare_app --port 8080
"""

from __future__ import annotations

import argparse

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    registry = CollectorRegistry()
    answered = Counter("answers", "Answers given", registry=registry)

    async def leader(request: web.Request) -> web.Response:
        answered.inc()
        return web.json_response({"leader": False}, status=503)

    app = web.Application()
    app.router.add_get("/leader", leader)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
