"""The lease stores under chaos, each with the faults that belong to it.

Every harness starts its store and a fenced resource of its own, tells a replica slot how its
sidecar reaches the store (through the slot's own `TcpProxy` where there is a network), and
implements the store-side faults: stall, loss of state, deletion of the lease record, a clock
step of the store host, the Kubernetes API's own faults, and the members of a replicated store
(etcd, ZooKeeper: `QuorumStore`) killed, paused, outvoted and cut off from each other.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path
from typing import ClassVar

from sidecar.backends.base import StoreUnavailable
from sidecar.backends.redis.scripts import lease_keys
from sidecar.backends.zookeeper.client import ZooKeeperStoreClient
from sidecar.backends.zookeeper.target import parse_target
from tests.chaos.clock import ClockShift
from tests.chaos.fence import FencedResource, RedisFence, SqliteFence
from tests.chaos.proxy import Mode, TcpProxy
from tests.etcd.cluster import EtcdCluster
from tests.etcd.cluster import Member as EtcdMember
from tests.fakekube import FakeKubeProcess, write_kubeconfig
from tests.redis.servers import RedisServer
from tests.zookeeper.servers import Ensemble, java
from tests.zookeeper.servers import Member as ZooKeeperMember

SIDECAR_LEASE = "default"  # the sidecar's lease name outside a cluster (SQLite, Redis)
KUBE_NAMESPACE = "demo"
KUBE_LEASE = "my-app"


class StoreHarness:
    """What every store offers; a store lacking a fault raises NotImplementedError."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]  # the store-specific fault kinds (see schedule.py)
    fence: FencedResource
    host_clock: ClockShift | None = None
    lease: str = SIDECAR_LEASE  # ``--lease``; a sharded run sets its base name

    def store_name(self, lease: str) -> str:
        """The store's name of a lease the API shows as ``lease``."""
        return lease

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        raise NotImplementedError

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        """(``--store`` value, extra arguments) for the sidecar of ``slot``."""
        raise NotImplementedError

    def proxy(self, slot: str) -> TcpProxy | None:
        return None

    async def stall(self, seconds: float) -> None:
        """The store answers nothing for ``seconds``; returns when it answers again."""
        raise NotImplementedError

    async def lose_state(self) -> None:
        """A restart without persistence: every lease record and counter is gone."""
        raise NotImplementedError

    async def delete_record(self, lease: str | None = None) -> None:
        """An operator (or a bug) deletes the lease record (``lease``: the store's name of
        one shard; None: the only lease)."""
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError


class SqliteStore(StoreHarness):
    """One SQLite file shared by every sidecar. No network, so no partition of one replica; a
    stall is a transaction holding the write lock (every sidecar's write waits on it)."""

    name = "sqlite"
    kinds = ("store_stall", "delete_after_grant", "delete_after_grant_twice")

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        self.path = directory / "leases.db"
        self.fence = SqliteFence(directory / "fence.db")

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        return f"sqlite:///{self.path}", []

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10, isolation_level=None)

    async def stall(self, seconds: float) -> None:
        def hold() -> None:
            conn = self._connect()
            try:
                conn.execute("BEGIN EXCLUSIVE")
                time.sleep(seconds)  # the stall itself: the lock is held this long
                conn.execute("ROLLBACK")
            finally:
                conn.close()

        await asyncio.to_thread(hold)

    async def delete_record(self, lease: str | None = None) -> None:
        def delete() -> None:
            conn = self._connect()
            try:
                if lease is None:
                    conn.execute("DELETE FROM leases")
                else:
                    conn.execute("DELETE FROM leases WHERE name = ?", (lease,))
            finally:
                conn.close()

        await asyncio.to_thread(delete)

    async def stop(self) -> None:
        await self.fence.close()


class ShiftedRedisServer(RedisServer):
    """A redis-server whose wall clock the test steps: a subclass sets ``ENV`` to the
    clockshift shim's LD_PRELOAD (libfaketime cannot run redis-server)."""


class RedisStore(StoreHarness):
    """A real redis-server (wall clock steppable), each sidecar reaching it through its own
    proxy; the fence is a second redis-server no fault touches."""

    name = "redis"
    kinds = (
        "store_stall",
        "store_restart",
        "store_restart_twice",
        "delete_after_grant",
        "delete_after_grant_twice",
        "partition_blackhole",
        "partition_reset",
        "clock_step_store",
    )

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        lease_dir = directory / "redis-lease"
        fence_dir = directory / "redis-fence"
        lease_dir.mkdir()
        fence_dir.mkdir()
        self.host_clock = ClockShift(shim, directory / "redis-clock")
        server_class = type("RedisWithClock", (ShiftedRedisServer,), {"ENV": self.host_clock.env})
        self.server: RedisServer = await asyncio.to_thread(server_class.start, lease_dir)
        self.fence_server = await asyncio.to_thread(RedisServer.start, fence_dir)
        self.fence = RedisFence(self.fence_server.url)
        self.proxies = {
            slot: await TcpProxy("127.0.0.1", self.server.port, slot).start() for slot in slots
        }

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        return f"redis://{self.proxies[slot].address}/0", []

    def proxy(self, slot: str) -> TcpProxy | None:
        return self.proxies[slot]

    async def stall(self, seconds: float) -> None:
        self.server.pause()
        try:
            await asyncio.sleep(seconds)  # the stall itself
        finally:
            self.server.resume()

    async def lose_state(self) -> None:
        await asyncio.to_thread(self.server.restart)

    async def delete_record(self, lease: str | None = None) -> None:
        holder, term, _channel = lease_keys(lease or self.lease)

        def delete() -> None:
            with self.server.client() as client:
                client.delete(holder, term)

        await asyncio.to_thread(delete)

    async def stop(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()
        await self.fence.close()
        self.server.stop()
        self.fence_server.stop()


class KubernetesStore(StoreHarness):
    """The fake API server in its own process; each sidecar reaches it through its own proxy
    (the fake's own partition cuts everyone). Freeze, 5xx and late writes are the fake's."""

    name = "kubernetes"
    lease = KUBE_LEASE
    kinds = (
        "store_stall",  # an API freeze: requests held, applied on resume
        "api_5xx",
        "late_write",
        "store_restart",  # the API server's storage wiped: the fake restarted empty
        "store_restart_twice",
        "delete_after_grant",
        "delete_after_grant_twice",
        "partition_blackhole",
        "partition_reset",
    )

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        self.directory = directory
        self.slots = slots
        self.fake = await asyncio.to_thread(FakeKubeProcess.start)
        await self._create_pods()
        port = int(self.fake.url.rsplit(":", 1)[1])
        self.proxies = {slot: await TcpProxy("127.0.0.1", port, slot).start() for slot in slots}
        self.kubeconfigs: dict[str, Path] = {}
        for slot, proxy in self.proxies.items():
            path = directory / f"kubeconfig-{slot}"  # the fake's, through this slot's proxy
            self.kubeconfigs[slot] = write_kubeconfig(
                path, f"http://{proxy.address}", KUBE_NAMESPACE
            )
        self.fence = SqliteFence(directory / "fence.db")

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        return "kubernetes", [
            "--namespace", KUBE_NAMESPACE,
            "--kubeconfig", str(self.kubeconfigs[slot]),
            "--pod-name", slot,
        ]  # fmt: skip

    def proxy(self, slot: str) -> TcpProxy | None:
        return self.proxies[slot]

    async def stall(self, seconds: float) -> None:
        await asyncio.to_thread(self.fake.set_faults, freeze=True)
        try:
            await asyncio.sleep(seconds)  # the freeze itself
        finally:
            await asyncio.to_thread(self.fake.clear_faults)

    async def errors(self, status: int, seconds: float) -> None:
        rule = {"status": status, "match": {"resources": ["leases"]}}
        await asyncio.to_thread(self.fake.set_faults, errors=[rule])
        try:
            await asyncio.sleep(seconds)
        finally:
            await asyncio.to_thread(self.fake.clear_faults)

    async def late_write(self, delay: float) -> None:
        """The next lease write is applied ``delay`` seconds after it arrived, long after its
        client gave up; returns once it has been applied."""
        writes = {"resources": ["leases"], "verbs": ["create", "update", "patch"]}
        late = [{"delay": delay, "count": 1, "match": writes}]
        await asyncio.to_thread(self.fake.set_faults, late=late)
        held_at = time.monotonic()
        deadline = held_at + 10
        while time.monotonic() < deadline:
            state = await asyncio.to_thread(self.fake.control, "GET", "/_fake/faults")
            if state["late"] and state["late"][0]["held"]:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(delay + 0.05)  # until the held write has been applied
        await asyncio.to_thread(self.fake.clear_faults)

    async def _create_pods(self) -> None:
        for slot in self.slots:
            await asyncio.to_thread(self.fake.create_pod, KUBE_NAMESPACE, slot)

    async def lose_state(self) -> None:
        """Stop the fake and start an empty one on the same ports (etcd lost, or restored
        from nothing): no Lease, resourceVersions from the start again. The pods are made
        again at once (they are not what is under test)."""
        port = int(self.fake.url.rsplit(":", 1)[1])
        control = int(self.fake.control_url.rsplit(":", 1)[1])
        await asyncio.to_thread(self.fake.stop)
        self.fake = await asyncio.to_thread(FakeKubeProcess.start, port=port, control_port=control)
        await self._create_pods()

    def store_name(self, lease: str) -> str:
        return lease.rsplit("/", 1)[-1]  # the API shows namespace/name

    async def delete_record(self, lease: str | None = None) -> None:
        await asyncio.to_thread(self.fake.delete_lease, KUBE_NAMESPACE, lease or self.lease)

    async def stop(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()
        await self.fence.close()
        await asyncio.to_thread(self.fake.stop)


class ProxyGroup:
    """One replica's proxies to every etcd member: a partition cuts all of them."""

    def __init__(self, proxies: list[TcpProxy]) -> None:
        self.proxies = proxies

    def set_mode(self, mode: Mode) -> None:
        for proxy in self.proxies:
            proxy.set_mode(mode)

    async def stop(self) -> None:
        for proxy in self.proxies:
            await proxy.stop()


class QuorumStore(StoreHarness):
    """A store of three members that agree by quorum (etcd, ZooKeeper): what the member faults
    of faults.py need of it."""

    peer_proxies: dict[str, TcpProxy | ProxyGroup]  # by member name: its peer traffic

    @property
    def members(self) -> list[EtcdMember] | list[ZooKeeperMember]:
        raise NotImplementedError

    def target(self, pick: float) -> EtcdMember | ZooKeeperMember:
        """The member a member fault hits, chosen by ``pick``."""
        raise NotImplementedError

    def cut_off_target(self, pick: float) -> EtcdMember | ZooKeeperMember:
        """The member ``member_partition`` cuts off from the others."""
        raise NotImplementedError

    def wait_ready(self) -> None:
        """Until every running member serves again (blocking: run it in a thread)."""
        raise NotImplementedError


class EtcdStore(QuorumStore):
    """A real three-member etcd cluster. Each sidecar lists every member (through proxies of
    its own, in the same order: they all talk to the first member until it fails them), and
    each member's peer traffic comes in through a proxy, so one member alone can be cut off
    from the others (a partitioned member keeps serving its clients' connections, and answers
    their linearizable requests with errors)."""

    name = "etcd"
    PREFIX = "chaos"
    kinds = (
        "member_sigkill",  # the member the sidecars talk to, or the Raft leader; restarted
        "member_sigstop",  # the same, paused, then resumed
        "quorum_lost",  # two of three members killed, then restarted
        "member_partition",  # the first member cut off from the other two (peer traffic)
        "snapshot_restore",  # every member restored from a snapshot older than the grants
        "store_stall",  # every member paused
        "delete_after_grant",
        "delete_after_grant_twice",
        "partition_blackhole",
        "partition_reset",
    )

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        (directory / "etcd").mkdir()
        # The peer proxies listen before the members' ports are chosen: a proxy's ephemeral
        # port can then not be one a member was given (and binds only at launch).
        unaimed = [await TcpProxy("127.0.0.1", 0).start() for _ in range(3)]
        self.cluster = EtcdCluster(directory / "etcd", 3)
        self.peer_proxies = {}
        for member, proxy in zip(self.cluster.members, unaimed, strict=True):
            proxy.upstream = ("127.0.0.1", member.peer_port)
            proxy.name = f"peer-{member.name}"
            member.advertised_peer_port = proxy.port
            self.peer_proxies[member.name] = proxy
        await asyncio.to_thread(self.cluster.launch)
        self.proxies = {
            slot: ProxyGroup(
                [
                    await TcpProxy("127.0.0.1", m.client_port, f"{slot}-{m.name}").start()
                    for m in self.cluster.members
                ]
            )
            for slot in slots
        }
        self.fence = SqliteFence(directory / "fence.db")

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        hosts = ",".join(proxy.address for proxy in self.proxies[slot].proxies)
        return f"etcd://{hosts}/{self.PREFIX}", []

    def proxy(self, slot: str) -> ProxyGroup:  # type: ignore[override]
        return self.proxies[slot]

    @property
    def members(self) -> list[EtcdMember]:
        return self.cluster.members

    def target(self, pick: float) -> EtcdMember:
        """The member every sidecar talks to first, or the Raft leader now."""
        if pick < 0.5:
            return self.cluster.members[0]
        return self.cluster.leader()

    def cut_off_target(self, pick: float) -> EtcdMember:
        return self.cluster.members[0]

    def wait_ready(self) -> None:
        self.cluster.wait_ready()

    async def stall(self, seconds: float) -> None:
        for member in self.cluster.members:
            member.pause()
        try:
            await asyncio.sleep(seconds)  # the stall itself
        finally:
            for member in self.cluster.members:
                member.resume()

    async def delete_record(self, lease: str | None = None) -> None:
        key = f"{self.PREFIX}/lease/{lease or self.lease}"
        await asyncio.to_thread(self.cluster.etcdctl, "del", key)

    async def stop(self) -> None:
        for group in self.proxies.values():
            await group.stop()
        await self.fence.close()
        await asyncio.to_thread(self.cluster.stop)
        for proxy in self.peer_proxies.values():
            await proxy.stop()


class PostgresStore(StoreHarness):
    """A real PostgreSQL 15 (its own server, not the tests' shared one), each sidecar reaching
    it through its own proxy, with a streaming standby kept beside it for a failover. The
    fence is a SQLite table of its own (the resource must not share the store's faults)."""

    name = "postgresql"
    kinds = (
        "store_stall",  # a table lock every statement waits behind
        "store_pause",  # SIGSTOP of the whole server, then SIGCONT
        "store_crash",  # SIGKILL of the server, restarted on its data (crash recovery)
        "terminate_sessions",  # pg_terminate_backend of every sidecar session
        "store_failover",  # promote a standby that missed the newest writes
        "delete_after_grant",
        "delete_after_grant_twice",
        "partition_blackhole",
        "partition_reset",
    )

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        from tests.postgresql.servers import PostgresServer, make_directory

        self._server_class = PostgresServer
        self._make_directory = make_directory
        self.server = await asyncio.to_thread(PostgresServer.start)
        self.database = "chaos"
        await asyncio.to_thread(self.server.psql, f"CREATE DATABASE {self.database}")
        self.proxies = {
            slot: await TcpProxy("127.0.0.1", self.server.port, slot).start() for slot in slots
        }
        self.standby: object | None = None
        self.link: TcpProxy | None = None
        await self._new_standby()
        self.fence = SqliteFence(directory / "fence.db")

    async def _new_standby(self) -> None:
        """A standby of the current primary, streaming through a proxy (``link``) the
        failover cuts, so what was in flight is lost too."""
        self.link = await TcpProxy("127.0.0.1", self.server.port, "replication").start()
        self.standby = await asyncio.to_thread(self.server.standby, via_port=self.link.port)

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        url = self.server.url(self.database).replace(
            f"127.0.0.1:{self.server.port}", self.proxies[slot].address
        )
        return url, []

    def proxy(self, slot: str) -> TcpProxy | None:
        return self.proxies[slot]

    async def stall(self, seconds: float) -> None:
        """Every statement on the lease table waits behind an exclusive lock."""
        import asyncpg

        connection = await asyncpg.connect(self.server.url(self.database))
        try:
            async with connection.transaction():
                await connection.execute(
                    "LOCK TABLE leader_sidecar.leases IN ACCESS EXCLUSIVE MODE"
                )
                await asyncio.sleep(seconds)  # the stall itself
        finally:
            await connection.close()

    async def pause(self, seconds: float) -> None:
        self.server.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.server.resume()

    async def crash(self) -> None:
        await asyncio.to_thread(self.server.restart, signal.SIGKILL)

    async def terminate_sessions(self) -> int:
        return await asyncio.to_thread(self.server.terminate_sessions, self.database)

    async def failover(self) -> None:
        """The standby stops receiving (its link reset), the primary writes on for a moment and
        is killed, the standby is promoted, and every sidecar's proxy now leads there. A new
        standby follows the new primary, for the next failover."""
        assert self.link is not None
        assert self.standby is not None
        self.link.set_mode("reset")
        await asyncio.sleep(0.3)  # renewals (or a grant) the standby never gets
        old = self.server
        await asyncio.to_thread(old.stop, signal.SIGKILL)
        standby = self.standby
        await asyncio.to_thread(standby.promote)  # type: ignore[attr-defined]
        self.server = standby  # type: ignore[assignment]
        for proxy in self.proxies.values():
            proxy.upstream = ("127.0.0.1", self.server.port)
            proxy.set_mode("reset")  # connections to the dead primary are gone anyway
            proxy.set_mode("open")
        await self.link.stop()
        await asyncio.to_thread(old.destroy)
        await self._new_standby()

    async def delete_record(self, lease: str | None = None) -> None:
        name = (lease or self.lease).replace("'", "''")
        await asyncio.to_thread(
            self.server.psql,
            f"DELETE FROM leader_sidecar.leases WHERE name = '{name}'; "
            f"DELETE FROM leader_sidecar.grants WHERE name = '{name}'",
            self.database,
        )

    async def stop(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()
        if self.link is not None:
            await self.link.stop()
        await self.fence.close()
        if self.standby is not None:
            await asyncio.to_thread(self.standby.destroy)  # type: ignore[attr-defined]
        await asyncio.to_thread(self.server.destroy)


class ZooKeeperStore(QuorumStore):
    """A real three-member ZooKeeper ensemble (tests/zookeeper/servers.py). Each sidecar lists
    every member through proxies of its own (its client starts at a random one and moves on
    when a connection breaks), and every member reaches each other member through proxies of
    that pair's own (quorum and election ports), so one member can be cut off from the two
    others, both ways, while its clients still reach it. A znode deleted by hand goes through a
    client of the harness's own that no fault's proxy carries."""

    name = "zookeeper"
    CHROOT = "/chaos"
    kinds = (
        "member_sigkill",  # a member killed (the ensemble's leader, or one by the seed); restarted
        "member_sigstop",  # the same, paused, then resumed
        "quorum_lost",  # two of three members killed, then restarted
        "member_partition",  # one member cut off from the other two (peer traffic)
        "ensemble_restart",  # every member killed, then started again on its data
        "store_restart",  # every member's data wiped: the ensemble starts again empty
        "store_stall",  # every member paused
        "delete_after_grant",
        "delete_after_grant_twice",
        "partition_blackhole",
        "partition_reset",
    )

    def __init__(self) -> None:
        # Empty until `start`: a start that fails (or skips: no java) stops cleanly.
        self.proxies: dict[str, ProxyGroup] = {}
        self.peer_proxies = {}

    async def start(self, directory: Path, shim: Path, slots: list[str]) -> None:
        java()  # skips (fails under CI) before anything starts when the package is missing
        (directory / "zookeeper").mkdir()
        # The peer proxies listen before the members' ports are chosen: a proxy's ephemeral
        # port can then not be one a member was given (and binds only at launch).
        unaimed = [await TcpProxy("127.0.0.1", 0).start() for _ in range(3 * 2 * 2)]
        self.ensemble = Ensemble(directory / "zookeeper", 3)
        pairs: dict[str, list[TcpProxy]] = {m.name: [] for m in self.ensemble.members}
        for member in self.ensemble.members:
            for peer in self.ensemble.members:
                if peer is member:
                    continue
                quorum, election = unaimed.pop(), unaimed.pop()
                quorum.upstream = ("127.0.0.1", peer.quorum_port)
                election.upstream = ("127.0.0.1", peer.election_port)
                quorum.name = f"{member.name}-{peer.name}-quorum"
                election.name = f"{member.name}-{peer.name}-election"
                member.peers[peer.myid] = (quorum.port, election.port)
                pairs[member.name] += [quorum, election]
                pairs[peer.name] += [quorum, election]
        self.peer_proxies = {name: ProxyGroup(proxies) for name, proxies in pairs.items()}
        for member in self.ensemble.members:
            member.launch()
        try:
            await asyncio.to_thread(self.ensemble.wait_serving)
        except BaseException:
            # The cluster's stop may not reach the store after a failed start: no server is
            # left running past the test.
            await asyncio.to_thread(self.ensemble.stop)
            raise
        self.proxies = {
            slot: ProxyGroup(
                [
                    await TcpProxy("127.0.0.1", m.client_port, f"{slot}-{m.name}").start()
                    for m in self.ensemble.members
                ]
            )
            for slot in slots
        }
        self.admin = ZooKeeperStoreClient(
            parse_target(self.ensemble.url(self.CHROOT)), request_timeout=2.0
        )
        self.fence = SqliteFence(directory / "fence.db")

    def sidecar_store(self, slot: str) -> tuple[str, list[str]]:
        hosts = ",".join(proxy.address for proxy in self.proxies[slot].proxies)
        return f"zookeeper://{hosts}{self.CHROOT}", []

    def proxy(self, slot: str) -> ProxyGroup:  # type: ignore[override]
        return self.proxies[slot]

    @property
    def members(self) -> list[ZooKeeperMember]:
        return self.ensemble.members

    def target(self, pick: float) -> ZooKeeperMember:
        """The ensemble's leader now, or a member chosen by ``pick``."""
        if pick < 0.5:
            return self.ensemble.leader()
        return self.ensemble.members[min(2, int((pick - 0.5) * 6))]

    def cut_off_target(self, pick: float) -> ZooKeeperMember:
        return self.target(pick)

    def wait_ready(self) -> None:
        self.ensemble.wait_serving()

    async def stall(self, seconds: float) -> None:
        for member in self.ensemble.members:
            member.pause()
        try:
            await asyncio.sleep(seconds)  # the stall itself
        finally:
            for member in self.ensemble.members:
                member.resume()

    async def restart_all(self, down: float) -> None:
        """Every member killed, down for ``down`` seconds, then started on its data; returns
        once the ensemble serves."""
        for member in self.ensemble.members:
            member.kill()
        await asyncio.sleep(down)
        for member in self.ensemble.members:
            member.launch()
        await asyncio.to_thread(self.ensemble.wait_serving)

    async def lose_state(self) -> None:
        """Every member's data directory wiped, the ensemble started again empty (a restore
        from nothing): no lease znode, zxids from zero."""
        await asyncio.to_thread(self.ensemble.restore_empty)

    async def delete_record(self, lease: str | None = None) -> None:
        """``deleteall`` of the lease's znode, by an operator's client of its own; tried again
        while the ensemble does not answer (it serves: a grant was just seen)."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                await self.admin.lease(lease or self.lease).delete_everything()
                return
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for group in self.proxies.values():
            await group.stop()
        if hasattr(self, "admin"):
            await self.admin.close()
            await self.fence.close()
        if hasattr(self, "ensemble"):
            await asyncio.to_thread(self.ensemble.stop)
        for peers in self.peer_proxies.values():
            await peers.stop()


STORES: dict[str, type[StoreHarness]] = {
    store.name: store
    for store in (
        SqliteStore,
        RedisStore,
        KubernetesStore,
        EtcdStore,
        PostgresStore,
        ZooKeeperStore,
    )
}
