"""The heartbeat recipe teams copy, written the way they write it.

A redis-py asyncio `Lock` with a TTL; the holder calls ``reacquire()`` (reset the TTL) every
third of it; followers try ``SET NX`` (``acquire(blocking=False)``) every 100 ms; a failed
renewal (lost ownership, or a Redis error) demotes; ``finally: lock.release()`` on the way out,
so SIGTERM hands over. Default client settings: no socket timeout.

    python -m benchmarks.anchors.redis_lock --url redis://127.0.0.1:6379/0 --key k --ttl 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

import redis.asyncio as redis
from redis.exceptions import LockError, RedisError

from benchmarks.anchors.endpoint import LeaderState, serve

POLL = 0.1  # followers retry SET NX every 100 ms


async def elect(lock: redis.lock.Lock, state: LeaderState, ttl: float) -> None:
    while True:
        state.store_requests += 1
        try:
            acquired = await lock.acquire(blocking=False)
        except RedisError:
            acquired = False
        if not acquired:
            await asyncio.sleep(POLL)
            continue
        state.lead()
        try:
            while True:
                await asyncio.sleep(ttl / 3)
                state.store_requests += 1
                await lock.reacquire()
        except (LockError, RedisError):
            pass  # lost it (or Redis failed): follow again
        finally:
            state.follow()
            with contextlib.suppress(LockError, RedisError):
                await lock.release()


async def main(args: argparse.Namespace) -> None:
    state = LeaderState(f"{args.name}_{os.urandom(4).hex()}")
    client = redis.Redis.from_url(args.url)
    lock = client.lock(args.key, timeout=args.ttl, thread_local=False)
    server = await serve(state, args.port)
    task = asyncio.create_task(elect(lock, state, args.ttl))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    server.close()
    await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default="bench-recipe")
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--name", default="recipe")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
