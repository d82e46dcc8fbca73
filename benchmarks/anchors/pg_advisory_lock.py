"""The PostgreSQL recipe teams copy: an advisory lock held by a session connection.

One asyncpg connection (default settings: no command timeout); followers try
``pg_try_advisory_lock(key)`` every 100 ms; the holder is leader for as long as it holds the
lock, i.e. as long as its session lives — it checks the session with ``SELECT 1`` every
100 ms and demotes when that fails; on SIGTERM it unlocks and exits, so the next follower
takes the lock. No term, no fence: nothing stops a paused holder's late writes, and a holder
cut off from the server keeps the lock until the server notices the dead session (TCP
keepalives, two hours by default).

    python -m benchmarks.anchors.pg_advisory_lock --url postgresql://… --key 42
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

import asyncpg

from benchmarks.anchors.endpoint import LeaderState, serve

POLL = 0.1  # followers retry, and the holder checks its session, every 100 ms


async def elect(url: str, key: int, state: LeaderState) -> None:
    connection: asyncpg.Connection | None = None
    try:
        while True:
            try:
                if connection is None or connection.is_closed():
                    connection = await asyncpg.connect(url)
                state.store_requests += 1
                if await connection.fetchval("SELECT pg_try_advisory_lock($1)", key):
                    state.lead()
                    while True:
                        await asyncio.sleep(POLL)
                        state.store_requests += 1
                        await connection.fetchval("SELECT 1")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                state.follow()  # the session is gone, and the lock with it
                if connection is not None:
                    connection.terminate()
                connection = None
            await asyncio.sleep(POLL)
    finally:
        state.follow()
        if connection is not None and not connection.is_closed():
            with contextlib.suppress(Exception):
                await connection.fetchval("SELECT pg_advisory_unlock_all()")
                await connection.close()


async def main(args: argparse.Namespace) -> None:
    state = LeaderState(f"{args.name}_{os.urandom(4).hex()}")
    server = await serve(state, args.port)
    task = asyncio.create_task(elect(args.url, args.key, state))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", type=int, default=42)
    parser.add_argument("--name", default="recipe")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
