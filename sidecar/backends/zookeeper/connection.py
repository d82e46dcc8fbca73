"""One ZooKeeper connection for every lease of a sidecar: the session, the epoch, what was last
seen of each znode, the one persistent recursive watch that every follower shares, and how
failures are reported. `ZooKeeperLease` objects (from `store`) and `ZooKeeperCandidates` (from
`candidates`) hold only their paths and borrow all of this; the `client.ZooKeeperStoreClient`
built on it makes them.

Znodes, under the chroot of the ``--store`` URL:

* ``CHROOT/leases/NAME`` — one per lease; its data the JSON value the etcd store writes too
  (`sidecar.backends.kit.lease_json`: holder, term, duration, a random version, stamps).
* ``CHROOT/candidates/GROUP/IDENTITY`` — one per candidate of a group (`candidates`).

Every write is conditional on the znode's data version as this client last saw it (a
``setData`` with that version), or on its absence (a ``create``): rule 1. The znode's data
version alone is not the contract's version: it restarts at 0 when a znode deleted by hand is
created again. The version reported is the value's random token with this client's epoch (a
count of its connections), so that what a client saw before it lost sight of the ensemble is
timed anew (rule 2), as on etcd.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sidecar.backends.base import LeaseRecord, StoreUnavailable
from sidecar.backends.kit import versions
from sidecar.backends.kit.guard import Guard
from sidecar.backends.kit.lease_json import decode_record
from sidecar.backends.zookeeper import jute
from sidecar.backends.zookeeper.jute import Node
from sidecar.backends.zookeeper.reads import FollowerReads
from sidecar.backends.zookeeper.session import ConnectionLost, ZkError, ZkSession
from sidecar.backends.zookeeper.target import ZooKeeperTarget
from sidecar.clock import SYSTEM_CLOCK, Clock

T = TypeVar("T")
# Answers that say this client is not served at all (not about one znode).
_NOT_SERVED = (jute.NO_AUTH, jute.AUTH_FAILED, jute.SESSION_EXPIRED)
logger = logging.getLogger("sidecar.zookeeper")


Follower = Callable[[], None]
"""Called (on the event loop) when a followed path may have changed, or the watch was armed
anew: the follower reads what it needs."""


class ZooKeeperConnection:
    """What every lease and candidate group of one sidecar shares in one ensemble: one
    session."""

    def __init__(
        self,
        target: ZooKeeperTarget,
        *,
        request_timeout: float = 2.0,
        session_timeout: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.target = target
        self.request_timeout = request_timeout
        self.clock = clock
        self.root = target.chroot
        self.leases_path = f"{self.root}/leases"
        self.candidates_path = f"{self.root}/candidates"
        digest = target.digest
        self.acl: tuple[tuple[int, str, str], ...] = (
            ((0x1F, "auth", ""),) if digest is not None else jute.OPEN_ACL_UNSAFE
        )
        self.session = ZkSession(
            target.hosts,
            # A session outlives a request timeout or two without an answer; the server
            # bounds it to its own [2, 20] ticks.
            session_timeout=session_timeout or max(4.0, 3 * request_timeout),
            request_timeout=request_timeout,
            on_event=self._event,
            on_connected=self._connected,
            auth=(("digest", digest),) if digest is not None else (),
            describe=target.describe(),
            ssl=target.ssl_context(),
        )
        # Bumped on every connection after the first: what was seen before may have been
        # missed since (a disconnect) or forgotten by the ensemble (a restore). Part of every
        # version.
        self.epoch = 0
        self.seen: dict[str, Node | None] = {}
        self.writes = 0
        self.guard = Guard("zookeeper", logger, lambda: self.description)
        self._followers: dict[str, set[Follower]] = {}  # path, or a prefix ending in "/"
        self._armed = asyncio.Event()  # the watch is on for the current connection
        self._arming: asyncio.Task[None] | None = None
        self._parents_made: set[str] = set()
        self.follower_reads = FollowerReads(self)

    @property
    def description(self) -> str:
        return self.target.describe()

    # -- versions ---------------------------------------------------------------------------

    def record(self, node: Node) -> LeaseRecord:
        record = decode_record(node.data)
        return dataclasses.replace(
            record, version=f"{record.version}{versions.epoch_tag(self.epoch)}"
        )

    def untagged(self, version: str) -> str | None:
        """The stored version a reported one names, or None if it was reported in an earlier
        epoch (no basis for a grant)."""
        return versions.untagged(version, self.epoch)

    # -- connection and watch ---------------------------------------------------------------

    def _connected(self, new_session: bool) -> None:
        if self.session.connections > 1:
            self.epoch += 1
        self.seen.clear()
        self._armed.clear()
        if new_session:
            self._parents_made.clear()
        if self._arming is not None:
            self._arming.cancel()
        self._arming = asyncio.get_running_loop().create_task(self._arm())

    async def _arm(self) -> None:
        """One persistent recursive watch on the chroot, for this connection (a reconnect to
        another server does not carry it, and an expired session lost it): armed before any
        follower reads again, so no change after their read goes unseen."""
        while True:
            try:
                await self.session.call(
                    jute.ADD_WATCH,
                    jute.add_watch(self.root, jute.PERSISTENT_RECURSIVE),
                    "add watch",
                )
            except ConnectionLost:
                return  # the next connection arms it
            except ZkError as error:
                message = f"zookeeper {self.description}: cannot watch: {error}"
                self.guard.report("warning", message, message)
                await asyncio.sleep(1.0)
                continue
            break
        self._armed.set()
        for followers in list(self._followers.values()):
            for follower in list(followers):
                follower()

    @property
    def watching(self) -> bool:
        return self.session.connected and self._armed.is_set()

    def _event(self, event: int, path: str) -> None:
        if event in (jute.NODE_CREATED, jute.NODE_DELETED, jute.NODE_DATA_CHANGED):
            if event == jute.NODE_DELETED:
                self.seen.pop(path, None)
            for follower in list(self._followers.get(path, ())):
                follower()
            parent = path.rpartition("/")[0] + "/"
            for follower in list(self._followers.get(parent, ())):
                follower()

    def follow(self, path: str, follower: Follower) -> Callable[[], None]:
        """Call ``follower`` whenever ``path`` (a znode, or every child of ``PATH/``) may have
        changed, and whenever the watch is armed anew; at once if it is armed already."""
        self.session.start()
        self._followers.setdefault(path, set()).add(follower)
        if self._armed.is_set():
            asyncio.get_running_loop().call_soon(follower)

        def stop() -> None:
            followers = self._followers.get(path)
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[path]

        return stop

    # -- requests ---------------------------------------------------------------------------

    async def call(self, opcode: int, body: jute.Writer, what: str) -> jute.Reader:
        """One request. Raises `ZkError` (an answer with an error code) or `StoreUnavailable`."""
        (answer,) = await self.calls(((opcode, body, what),))
        if isinstance(answer, ZkError):
            raise answer
        return answer

    async def calls(
        self, requests: Sequence[tuple[int, jute.Writer, str]]
    ) -> list[jute.Reader | ZkError]:
        """``requests`` (opcode, body, what) sent back to back, in one round trip
        (`ZkSession.calls`): each answer or its `ZkError`. Raises `StoreUnavailable` when one
        is not answered, or answered that this client may not be served."""
        try:
            answers = await self.session.calls(requests)
        except ConnectionLost as lost:
            raise self.fail("warning", str(lost)) from None
        for (_opcode, _body, what), answer in zip(requests, answers, strict=True):
            if isinstance(answer, ZkError) and answer.code in _NOT_SERVED:
                raise self.fail("error", f"{what}: {answer}")
        self.guard.answered()
        return answers

    async def guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run one store operation; anything that is not an answer about the lease becomes
        `StoreUnavailable`."""
        return await self.guard.run(work, self._failed)

    def _failed(self, exc: Exception) -> StoreUnavailable:
        if isinstance(exc, ZkError):
            return self.fail("error", str(exc))
        # A malformed answer: the contract allows only StoreErrors.
        return self.fail("error", f"unexpected answer: {type(exc).__name__}: {exc}")

    def fail(self, level: str, cause: str) -> StoreUnavailable:
        message = f"zookeeper {self.description}: {cause}"
        self.guard.report(level, message, message)
        return StoreUnavailable(message)

    async def read(self, path: str) -> Node | None:
        """The znode as the connected server has it (None: absent). Raises `StoreUnavailable`."""
        epoch = self.epoch
        try:
            answer = await self.call(jute.GET_DATA, jute.path_watch(path), "read")
        except ZkError as error:
            if error.code != jute.NO_NODE:
                raise
            node = None
        else:
            node = Node(answer.buffer() or b"", answer.stat())
        self.saw(path, node, epoch)
        return node

    async def multi_read(
        self, ops: Sequence[tuple[int, jute.Writer]], what: str = "read many"
    ) -> list[jute.MultiResult]:
        """``ops`` (`jute.GET_DATA`, `jute.GET_CHILDREN`) in one request (``multiRead``,
        ZooKeeper 3.6+): each answered on its own, an error in one leaving the others
        answered. Raises `StoreUnavailable` (or `ZkError`) when the request as a whole was
        not answered."""
        results = jute.read_multi(await self.call(jute.MULTI_READ, jute.multi(ops), what))
        if len(results) != len(ops):
            raise self.fail("error", f"a multiRead of {len(ops)} answered {len(results)}")
        return results

    async def read_many(self, paths: Sequence[str]) -> list[Node | StoreUnavailable | None]:
        """What `read` answers for each of ``paths``, in one request (`multi_read`): the
        znode, None where it is absent, or that path's own error (a `StoreUnavailable` in its
        place, the others answered). Raises `StoreUnavailable` when the request as a whole was
        not answered."""
        epoch = self.epoch
        results = await self.multi_read([(jute.GET_DATA, jute.path_watch(p)) for p in paths])
        answers: list[Node | StoreUnavailable | None] = []
        for path, result in zip(paths, results, strict=True):
            if result.err == jute.OK:
                assert result.stat is not None
                node: Node | None = Node(result.data or b"", result.stat)
            elif result.err == jute.NO_NODE:
                node = None
            else:
                error = jute.error_name(result.err)
                message = f"zookeeper {self.description}: read {path}: {error}"
                # One line for a thousand paths refused alike, not one each.
                self.guard.report("error", f"read: {error}", message)
                answers.append(StoreUnavailable(message))
                continue
            self.saw(path, node, epoch)
            answers.append(node)
        return answers

    async def make_parents(self, path: str) -> None:
        """Create every missing ancestor of ``path`` (empty znodes)."""
        parent = path.rpartition("/")[0]
        if not parent or parent in self._parents_made:
            return
        parts = parent.split("/")[1:]
        for depth in range(1, len(parts) + 1):
            ancestor = "/" + "/".join(parts[:depth])
            if ancestor in self._parents_made:
                continue
            try:
                await self.call(jute.CREATE, jute.create(ancestor, b"", self.acl), "create parent")
            except ZkError as error:
                if error.code != jute.NODE_EXISTS:
                    raise
            self._parents_made.add(ancestor)

    async def swap(
        self, what: str, path: str, seen: Node | None, data: bytes
    ) -> tuple[bool, Node | None]:
        """Write ``data`` if ``path`` still holds exactly ``seen`` (None: nothing) — a
        ``setData`` on its data version, or a ``create`` (rule 1). Returns (written, what the
        znode holds now): the write, or a fresh read instead."""
        self.writes += 1
        epoch = self.epoch
        try:
            if seen is None:
                await self.make_parents(path)
                answer = await self.call(jute.CREATE2, jute.create(path, data, self.acl), what)
                answer.string()  # the path created
            else:
                answer = await self.call(
                    jute.SET_DATA, jute.set_data(path, data, seen.stat.version), what
                )
        except ZkError as error:
            if error.code not in (jute.NODE_EXISTS, jute.BAD_VERSION, jute.NO_NODE):
                raise
            return False, await self.read(path)
        node = Node(data, answer.stat())
        self.saw(path, node, epoch)
        return True, node

    async def multi(
        self, what: str, ops: Sequence[tuple[int, jute.Writer]]
    ) -> list[jute.MultiResult]:
        """``ops`` (opcode, body) all or none, in one request: each one's result. When one
        fails, nothing is written: the first that failed carries its error, those before it
        `jute.OK`, those after it `jute.RUNTIME_INCONSISTENCY` (not tried)."""
        self.writes += 1
        results = jute.read_multi(await self.call(jute.MULTI, jute.multi(ops), what))
        if len(results) != len(ops):
            raise self.fail("error", f"a multi of {len(ops)} answered {len(results)}")
        return results

    def saw(self, path: str, node: Node | None, epoch: int) -> None:
        """Remember ``node`` as what ``path`` holds, unless the connection changed since
        ``epoch`` (what this client saw is forgotten on every connection)."""
        if epoch == self.epoch:
            self.seen[path] = node

    async def delete(self, path: str, version: int = -1) -> bool:
        try:
            await self.call(jute.DELETE, jute.delete(path, version), "delete")
        except ZkError as error:
            if error.code not in (jute.NO_NODE, jute.BAD_VERSION):
                raise
            return False
        self.seen.pop(path, None)
        return True

    async def close(self) -> None:
        if self._arming is not None:
            self._arming.cancel()
        await self.follower_reads.close()
        await self.session.close()
