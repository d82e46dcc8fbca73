"""An app beside a sidecar that fences its writes in the database: a real process for the fence
tests. One task follows the sidecar's ``GET /leader`` (long-poll with ``If-None-Match``); each
of ``--workers`` connections loops: while the last answer said leader, one transaction —
``SELECT leader_sidecar.fence(lease, term)``, an insert into ``app_writes``, ``--hold``
seconds of "work", commit. It acts on the last answer it has, as an app does, so while its
sidecar is paused or cut off it keeps writing with the old term: the writes the fence must
order before any newer grant.

    python -m tests.postgresql.fenced_app --leader http://127.0.0.1:4040 --db URL \\
        --lease default --workers 50 --hold 0.05 --name app-0

Prints one JSON line when its connections are open; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal

import aiohttp
import asyncpg

APP_TABLES = """
CREATE TABLE IF NOT EXISTS app_writes (
    id serial PRIMARY KEY, term bigint NOT NULL, writer text NOT NULL
);
"""


class Leadership:
    """The last answer of the sidecar: (leader?, term)."""

    def __init__(self) -> None:
        self.term: int | None = None

    async def follow(self, url: str) -> None:
        etag = '""'
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(
                        f"{url}?wait=5", headers={"If-None-Match": etag}
                    ) as response:
                        body = await response.json()
                        etag = response.headers.get("ETag", etag)
                        self.term = int(body["term"]) if response.status == 200 else None
                except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                    await asyncio.sleep(0.05)  # keep the last answer: a stale app does


async def work(args: argparse.Namespace, leadership: Leadership, ready: asyncio.Event) -> None:
    connection = await asyncpg.connect(args.db)
    ready.set()
    while True:
        term = leadership.term
        if term is None:
            await asyncio.sleep(0.01)
            continue
        try:
            async with connection.transaction():
                await connection.fetchval("SELECT leader_sidecar.fence($1, $2)", args.lease, term)
                await connection.execute(
                    "INSERT INTO app_writes (term, writer) VALUES ($1, $2)", term, args.name
                )
                await asyncio.sleep(args.hold)
        except asyncpg.PostgresError:
            await asyncio.sleep(0.01)  # refused: not the leader with this term any more
        except (OSError, asyncpg.InterfaceError):
            with contextlib.suppress(Exception):
                connection.terminate()
            await asyncio.sleep(0.05)
            connection = await asyncpg.connect(args.db)


async def main(args: argparse.Namespace) -> None:
    leadership = Leadership()
    follower = asyncio.create_task(leadership.follow(args.leader))
    readies = [asyncio.Event() for _ in range(args.workers)]
    workers = [asyncio.create_task(work(args, leadership, ready)) for ready in readies]
    await asyncio.gather(*(ready.wait() for ready in readies))
    print(json.dumps({"ready": args.name}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in [follower, *workers]:
        task.cancel()
    await asyncio.gather(follower, *workers, return_exceptions=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--leader", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--lease", default="default")
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--name", default="app")
    asyncio.run(main(parser.parse_args()))
