"""The candidates of one group in ZooKeeper: one persistent znode per replica,
``CHROOT/candidates/GROUP/IDENTITY``, whose data is JSON ``{"identity", "version", "revision",
"priority", "leaving", "app", "started_at", "beat_at"}`` (as on etcd: `get` in ``zkCli.sh``
shows it).

Beats, not ephemeral znodes: a replica's liveness is observed from its versions on the
reader's own clock like a lease's (rule 2), the same on every store. An ephemeral znode would
make liveness the ensemble's session timeout instead, and a sidecar whose session expired
would vanish from the group while it is still up and beating. Each replica writes only its
own znode, unconditionally (nobody else writes it), a new version on every beat. ``beat_at``
is wall time, for humans and for the garbage collection here: once a minute a beating replica
removes the records not beaten for 20 leases (at least a minute) by its clock, each removal
conditional on the znode's data version, so a replica that beat in between keeps its record.

`changes` follows the group on the client's persistent recursive watch and yields every record
at each change (every beat is one).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sidecar.backends import records
from sidecar.backends.base import Candidate, StoreError, StoreUnavailable
from sidecar.backends.kit import candidate_json
from sidecar.backends.kit.candidate_json import candidate_object
from sidecar.backends.kit.lease_json import encode
from sidecar.backends.kit.versions import new_version
from sidecar.backends.zookeeper import jute
from sidecar.backends.zookeeper.jute import Node
from sidecar.backends.zookeeper.session import ZkError
from sidecar.logs import log

if TYPE_CHECKING:
    from sidecar.backends.zookeeper.connection import ZooKeeperConnection

logger = logging.getLogger("sidecar.zookeeper")

GC_LEASES = 20
GC_MIN = 60.0  # seconds
GC_EVERY = 60.0  # monotonic seconds between two garbage collections of one registry


def decode(name: str, data: bytes) -> Candidate:
    """The candidate a znode holds, checked (`sidecar.backends.records`): a value that is not
    ours, or one under another identity's name, is left out by the reader (and left alone)."""
    candidate = candidate_json.decode(name, data)
    if candidate.unreadable is None and name != candidate.identity:
        problem = f"identity {candidate.identity!r} written under another identity's znode"
        return records.unreadable_candidate(name, candidate.version, problem)
    return candidate


class ZooKeeperCandidates:
    def __init__(self, client: ZooKeeperConnection, group: str) -> None:
        self.client = client
        self.group = group
        self.path = f"{client.candidates_path}/{group}"
        self._last_gc = float("-inf")
        self._following = 0
        self._names: builtins.list[str] = []  # the children the last listing found

    def _znode(self, identity: str) -> str:
        return f"{self.path}/{identity}"

    async def beat(self, candidate: Candidate, duration: float) -> None:
        async def work() -> None:
            wall = self.client.clock.wall()
            await self._put(self._znode(candidate.identity), self._value(candidate, wall))
            await self._maybe_collect(wall, duration)

        await self.client.guarded(work)

    async def beat_and_list(
        self, candidate: Candidate, duration: float
    ) -> builtins.list[Candidate]:
        """`ListsOnBeat`: the beat's ``setData`` and the group's ``multiRead`` sent back to
        back on the session, one round trip. A ``multi`` cannot mix reads with writes; the
        session's order gives what the protocol asks for: the server handles the read after
        the beat is written, so the list holds the beat (or, for another replica's record,
        something newer — a read a moment later would show it too). A replica whose record
        is not there yet beats with a ``create`` first and lists after it."""

        async def work() -> builtins.list[Candidate]:
            client = self.client
            wall = client.clock.wall()
            path = self._znode(candidate.identity)
            value = self._value(candidate, wall)
            known = list(self._names)
            beat, listing = await client.calls(
                (
                    (jute.SET_DATA, jute.set_data(path, value, -1), "beat"),
                    (jute.MULTI_READ, jute.multi(self._listing_ops(known)), "list"),
                )
            )
            if isinstance(beat, ZkError):
                if beat.code != jute.NO_NODE:
                    raise beat
                await self._put(path, value)
                nodes = await self._nodes()
            else:
                if isinstance(listing, ZkError):
                    raise listing
                nodes = await self._nodes_from(known, jute.read_multi(listing))
            await self._maybe_collect(wall, duration)
            return [decode(name, node.data) for name, node in nodes.items()]

        return await self.client.guarded(work)

    def _value(self, candidate: Candidate, wall: datetime) -> bytes:
        return encode(candidate_object(candidate, candidate.version or new_version(), wall))

    async def _maybe_collect(self, wall: datetime, duration: float) -> None:
        now = self.client.clock.now()
        if now - self._last_gc >= GC_EVERY:
            self._last_gc = now
            await self._collect(wall - timedelta(seconds=max(GC_MIN, GC_LEASES * duration)))

    async def _put(self, path: str, value: bytes) -> None:
        """Write ``path`` whatever it holds, creating it (and its parents) where absent."""
        client = self.client
        for _ in range(3):
            try:
                await client.call(jute.SET_DATA, jute.set_data(path, value, -1), "beat")
                return
            except ZkError as error:
                if error.code != jute.NO_NODE:
                    raise
            await client.make_parents(path)
            try:
                await client.call(jute.CREATE, jute.create(path, value, client.acl), "beat")
                return
            except ZkError as error:
                if error.code != jute.NODE_EXISTS:
                    raise
        raise client.fail("warning", f"{path} kept appearing and vanishing under the beat")

    async def list(self) -> builtins.list[Candidate]:
        async def work() -> builtins.list[Candidate]:
            return [decode(name, node.data) for name, node in (await self._nodes()).items()]

        return await self.client.guarded(work)

    async def _nodes(self) -> dict[str, Node]:
        """Every record of the group: its children and the records of those listed last
        time in one ``multiRead``, and those new since in one more."""
        known = list(self._names)
        results = await self.client.multi_read(self._listing_ops(known), "list")
        return await self._nodes_from(known, results)

    def _listing_ops(self, known: builtins.list[str]) -> builtins.list[tuple[int, jute.Writer]]:
        return [(jute.GET_CHILDREN, jute.path_watch(self.path))] + [
            (jute.GET_DATA, jute.path_watch(self._znode(name))) for name in known
        ]

    async def _nodes_from(
        self, known: builtins.list[str], results: builtins.list[jute.MultiResult]
    ) -> dict[str, Node]:
        """The group from a listing's answer (`_listing_ops` of ``known``): the children it
        names, each with its record — read with the children, or now where it is new."""
        if len(results) != len(known) + 1:
            raise self.client.fail("error", f"a list of {len(known)} answered {len(results)}")
        children = results[0]
        if children.err not in (jute.OK, jute.NO_NODE):
            raise ZkError(children.err, "list")
        names = builtins.list(children.children)
        self._names = names
        nodes: dict[str, Node] = {}
        for name, result in zip(known, results[1:], strict=True):
            if result.err == jute.OK and result.stat is not None:
                nodes[name] = Node(result.data or b"", result.stat)
            elif result.err != jute.NO_NODE:
                raise ZkError(result.err, f"read {self._znode(name)}")
        new = [name for name in names if name not in nodes]
        read = await self.client.read_many([self._znode(name) for name in new]) if new else []
        for name, node in zip(new, read, strict=True):
            if isinstance(node, StoreUnavailable):
                raise node
            if node is not None:
                nodes[name] = node
        return {name: nodes[name] for name in names if name in nodes}

    async def leave(self, identity: str) -> None:
        async def work() -> None:
            await self.client.delete(self._znode(identity))

        await self.client.guarded(work)

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """Every record of the group at each change, after every (re)arming of the watch."""
        signal = asyncio.Event()
        stop = self.client.follow(self.path + "/", signal.set)
        self._following += 1
        try:
            while True:
                await signal.wait()
                signal.clear()
                try:
                    listed = await self.list()
                except StoreError:
                    yield None  # read it yourself; the next arming tells again
                    continue
                yield listed
        finally:
            self._following -= 1
            stop()

    def following(self) -> bool:
        return self._following > 0 and self.client.watching

    async def _collect(self, older_than: datetime) -> None:
        """Remove records beaten before ``older_than`` (wall clock: garbage collection only),
        each only if nobody wrote it since it was read. Best effort."""
        try:
            for name, node in (await self._nodes()).items():
                beat_at = decode(name, node.data).beat_at
                if beat_at is None or beat_at.tzinfo is None or beat_at >= older_than:
                    continue
                if await self.client.delete(self._znode(name), node.stat.version):
                    log(logger, "info", "removed a stale candidate", identity=name)
        except (StoreError, ZkError):
            return
