"""``etcdctl elect``, etcd's own election (``concurrency.Election`` in the etcd client), behind
the anchors' ``/leader``.

The child ``etcdctl elect NAME PROPOSAL`` campaigns on the election's prefix with a session
lease (60 s: etcdctl has no flag for it), prints the leader key and proposal once it has won,
holds leadership while it runs and resigns on SIGTERM. This wrapper reports "leader" from that
line until the child exits; it runs in the child's process group, so a signal to the group
(SIGKILL, SIGSTOP) reaches both, as it would reach ``etcdctl`` alone.

    python -m benchmarks.anchors.etcd_elect --endpoints 127.0.0.1:2379 --election e
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal

from benchmarks.anchors.endpoint import LeaderState, serve


async def elect(args: argparse.Namespace, state: LeaderState) -> int:
    env = {**os.environ, "ETCDCTL_API": "3"}
    child = await asyncio.create_subprocess_exec(
        "etcdctl", "--endpoints", args.endpoints, "elect", args.election, state.identity,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    state.child = child.pid  # type: ignore[attr-defined]
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, child.terminate)
    assert child.stdout is not None
    while line := await child.stdout.readline():
        if line.strip() == state.identity.encode():  # the proposal: printed once it has won
            state.lead()
    state.follow()
    return await child.wait()


async def main(args: argparse.Namespace) -> None:
    state = LeaderState(f"{args.name}_{os.urandom(4).hex()}")
    server = await serve(state, args.port)
    with contextlib.suppress(asyncio.CancelledError):
        await elect(args, state)
    server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--election", default="bench-etcdctl")
    parser.add_argument("--name", default="etcdctl")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
