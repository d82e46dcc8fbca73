"""One lease in ZooKeeper: the contract's requests, each one conditional write
(`sidecar.backends.kit.swap_lease`), and its watch.

A swap is a ``setData`` on the data version this client saw last (from its own write, a read,
or a read the watch triggered), or a ``create`` where it saw nothing; one that finds something
else reads it instead. The term lives in the value, not the zxid: a zxid cannot be chosen above
a floor, and a wiped or restored ensemble counts its zxids again from where its data is
(docs/zookeeper.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from sidecar.backends.base import LeaseRecord
from sidecar.backends.kit.swap_lease import SwapLease
from sidecar.backends.zookeeper.connection import ZooKeeperConnection
from sidecar.backends.zookeeper.jute import Node


class ZooKeeperLease(SwapLease[str, Node]):
    """The store of lease ``name`` on ``client``. Cheap: it holds its path."""

    earlier_epoch = "the lease was seen on an earlier connection"
    client: ZooKeeperConnection

    def __init__(self, client: ZooKeeperConnection, name: str) -> None:
        super().__init__(client, name, f"{client.leases_path}/{name}")

    # -- the watch --------------------------------------------------------------------------

    def follow(self, callback: Callable[[LeaseRecord | None], None]) -> Callable[[], None]:
        """`FollowsByCall`: the record after every (re)arming of the client's watch and after
        every change it reports, read from the server (events carry no data) together with
        the other leases changed at once (`reads.FollowerReads`). Reads of one lease never
        overlap: changes during a read are read once more after it."""
        state = {"reading": False, "again": False, "stopped": False}

        async def read_loop() -> None:
            while state["again"] and not state["stopped"]:
                state["again"] = False
                try:
                    node = await self.client.follower_reads.read(self.key)
                except Exception:  # unavailable: the next connection reads again
                    continue
                if not state["stopped"]:
                    callback(self._record(node))
            state["reading"] = False

        def changed() -> None:
            state["again"] = True
            if not state["reading"]:
                state["reading"] = True
                task = asyncio.get_running_loop().create_task(read_loop())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        tasks: set[asyncio.Task[None]] = set()
        unfollow = self.client.follow(self.key, changed)

        def stop() -> None:
            state["stopped"] = True
            unfollow()
            for task in tasks:
                task.cancel()

        return stop

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        """What `follow` calls with, as an iterator. Never raises."""
        queue: asyncio.Queue[LeaseRecord | None] = asyncio.Queue()
        stop = self.follow(queue.put_nowait)
        try:
            while True:
                yield await queue.get()
        finally:
            stop()

    async def close(self) -> None:
        """Nothing of its own: the watch belongs to the client."""

    # -- tests and operators ----------------------------------------------------------------

    async def delete_everything(self) -> None:
        """Delete the lease's znode, term included (tests; an operator's ``deleteall``)."""
        await self.client.delete(self.key)
