"""kazoo's leader election recipe (``client.Election(path, identifier).run(func)``), the one a
Python team on ZooKeeper would pick, behind the anchors' ``/leader``.

Used as kazoo's docs say: one `KazooClient` (its default threading handler and retry), a state
listener as the lock recipe's docs ask for ("watch for LOST and SUSPENDED state changes and
re-act appropriately"): SUSPENDED (no answer from the server for two thirds of the session
timeout) stops claiming, CONNECTED on the same session claims again, LOST (the session expired:
its lock znode is gone) ends the leader function and the replica runs for election again.
Leadership is the recipe's lock: an ephemeral sequential znode under the election path, the
lowest one leads, each contender watches the one before it. The session timeout is its lease:
a crashed leader's znode goes when the server expires its session. On SIGTERM the leader
returns from its function (the recipe deletes its znode), a follower cancels, and the client
closes its session.

    python -m benchmarks.anchors.kazoo_election --hosts 127.0.0.1:2181 --path /e --timeout 1
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import threading

from kazoo.client import KazooClient, KazooState

from benchmarks.anchors.endpoint import LeaderState, serve


class Campaign:
    """The election, run on a thread of its own: ``Election.run`` blocks."""

    def __init__(self, client: KazooClient, path: str, state: LeaderState) -> None:
        self.client = client
        self.path = path
        self.state = state
        self.stopping = threading.Event()
        self.leave = threading.Event()  # ends the leader function: session lost, or stopping
        self.leading = False
        self.election = client.Election(path, state.identity)
        client.add_listener(self.on_state)

    def on_state(self, state: str) -> None:
        """kazoo's connection thread: must not block. ``LeaderState`` is plain attributes,
        set under the GIL; the ``/leader`` handler reads them."""
        if state == KazooState.SUSPENDED:
            self.state.follow()
        elif state == KazooState.CONNECTED and self.leading:
            self.state.lead()
        elif state == KazooState.LOST:
            self.state.follow()
            self.leave.set()

    def lead(self) -> None:
        self.leading = True
        self.state.lead()
        self.leave.wait()
        self.leading = False
        self.state.follow()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.leave.clear()
            try:
                self.election.run(self.lead)
            except Exception:  # a connection error while contending: contend again
                logging.warning("election ended by an error; running again", exc_info=True)
                self.stopping.wait(0.1)
            self.election = self.client.Election(self.path, self.state.identity)

    def stop(self) -> None:
        self.stopping.set()
        self.state.follow()
        self.leave.set()  # the leader returns; the recipe deletes its znode
        self.election.cancel()  # a follower stops contending


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    state = LeaderState(f"{args.name}_{os.urandom(4).hex()}")
    client = KazooClient(hosts=args.hosts, timeout=args.timeout)
    server = await serve(state, args.port)
    await asyncio.to_thread(client.start)
    campaign = Campaign(client, args.path, state)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, campaign.stop)
    try:
        await asyncio.to_thread(campaign.run)
    finally:
        server.close()
        await asyncio.to_thread(client.stop)
        client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--path", default="/bench-kazoo/election")
    parser.add_argument("--timeout", type=float, default=1.0, help="session timeout, seconds")
    parser.add_argument("--name", default="kazoo")
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
