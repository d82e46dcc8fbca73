"""The stores (the fake Kubernetes API server, a redis-server) and the systems on them: our
sidecar and the anchor for that store, with the same lease and renew interval.

Each system knows how to start a replica, where its lease lives on the store, when the store
last accepted a write to that lease (the store's own record: the fake's request log, Redis
``MONITOR``), how to reset the lease to empty, and how to hand the lease to an intruder the way
another candidate's grant would look."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import redis

from benchmarks.processes import AnchorProcess
from tests.fakekube import FakeKubeProcess
from tests.support.sidecars import SidecarProcess

if TYPE_CHECKING:
    from benchmarks.zookeeper_frames import FrameProxies

NAMESPACE = "demo"
Replica = SidecarProcess | AnchorProcess


class System(Protocol):
    label: str
    ours: bool
    lease: float  # seconds
    renew: float  # seconds between the leader's renewals

    def start(self, name: str, slot: str) -> Replica: ...
    def last_write_before(self, moment: float) -> float | None: ...
    def reset(self) -> None: ...
    def takeover(self) -> float: ...


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def no_args(slot: str) -> Sequence[str]:
    """A system's further flags for the replica in ``slot``: none (`extra_args`)."""
    return ()


def _micro_time(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- Kubernetes (the fake API server in its own process) ----------------------------------------


class KubeStore:
    name = "Kubernetes (fake API server)"
    lease = 3.0  # the official elector takes whole seconds, retry >= 1 s, deadline > 1.2 retry

    def __init__(self, tmp: Path) -> None:
        self.fake = FakeKubeProcess.start()
        self.kubeconfig = self.fake.kubeconfig(tmp / "kubeconfig", NAMESPACE)

    def wall(self, monotonic: float) -> float:
        """The fake logs arrival on CLOCK_MONOTONIC, which every process on the host shares."""
        return monotonic + (time.time() - time.monotonic())

    def last_write_before(self, lease: str, moment: float) -> float | None:
        """The arrival of the last write to ``lease`` that was done before ``moment``: one
        the fake held (a freeze) and applied later is not, though it arrived before."""
        writes = [
            self.wall(r["t"])
            for r in self.fake.requests()
            if r["resource"] == "leases"
            and r["name"] == lease
            and r["verb"] in ("create", "update", "patch")
            and r["status"] in (200, 201)
            and self.wall(r["t"] + (r.get("seconds") or 0.0)) <= moment
        ]
        return max(writes, default=None)

    def path(self, lease: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease}"

    def reset(self, lease: str) -> None:
        """An empty Lease (no holder): what the official elector needs to exist, and a
        released lease to our sidecar."""
        self.fake.delete_lease(NAMESPACE, lease)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease, "namespace": NAMESPACE},
            "spec": {"leaseDurationSeconds": int(self.lease)},
        }
        status, answer = self.fake.request(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", body
        )
        if status != 201:
            raise RuntimeError(f"create lease {lease}: {status} {answer}")

    def takeover(self, lease: str) -> float:
        """Another candidate's grant: a conditional replace naming ``intruder``, next term."""
        for _ in range(20):
            obj = self.fake.lease(NAMESPACE, lease)
            assert obj is not None
            now = _micro_time(time.time())
            spec = obj["spec"]
            spec["holderIdentity"] = f"intruder_{uuid.uuid4().hex[:8]}"
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["acquireTime"] = spec["renewTime"] = now
            began = time.time()
            status, _ = self.fake.request("PUT", self.path(lease), obj)
            if status == 200:
                return began
        raise RuntimeError("takeover: the Lease kept changing")

    def stall(self) -> None:
        self.fake.set_faults(freeze=True)  # every request held until the faults change

    def unstall(self) -> None:
        self.fake.clear_faults()

    def close(self) -> None:
        self.fake.stop()


class OursOnKube:
    label = "leader-sidecar"
    ours = True

    def __init__(self, store: KubeStore, lease: str = "bench-ours") -> None:
        self.store = store
        self.lease_name = lease
        self.lease = store.lease
        self.renew = store.lease / 3
        # Each slot's further flags (e.g. its own app's health URL, `benchmarks.app_failover`).
        self.extra_args: Callable[[str], Sequence[str]] = no_args
        if self.ours:
            for slot in ("0", "1", "2", "start"):  # one pod per slot, for the role labels
                if store.fake.pod(NAMESPACE, f"ours-{slot}") is None:  # (another lease's pool)
                    store.fake.create_pod(NAMESPACE, f"ours-{slot}")

    def start(self, name: str, slot: str) -> Replica:
        pod = f"ours-{slot}"
        return SidecarProcess.start(
            name,
            "kubernetes",
            lease_duration=f"{self.lease:g}s",
            args=[
                "--lease",
                self.lease_name,
                "--namespace",
                NAMESPACE,
                "--kubeconfig",
                str(self.store.kubeconfig),
                "--pod-name",
                pod,
                "--log-level",
                "info",
                *self.extra_args(slot),
            ],
        )

    def last_write_before(self, moment: float) -> float | None:
        return self.store.last_write_before(self.lease_name, moment)

    def reset(self) -> None:
        self.store.reset(self.lease_name)

    def takeover(self) -> float:
        return self.store.takeover(self.lease_name)


class OfficialOnKube(OursOnKube):
    label = "official elector"
    ours = False

    def __init__(self, store: KubeStore, lease: str = "bench-official") -> None:
        super().__init__(store, lease)
        self.renew = 1.0  # its retry period: the leader renews every retry period

    def start(self, name: str, slot: str) -> Replica:
        return AnchorProcess.start(
            "k8s_elector",
            name,
            [
                "--kubeconfig",
                str(self.store.kubeconfig),
                "--namespace",
                NAMESPACE,
                "--lease",
                self.lease_name,
                "--lease-duration",
                str(int(self.lease)),
                "--renew-deadline",
                "2",
                "--retry-period",
                "1",
            ],
        )


# -- Redis ----------------------------------------------------------------------------------------


class RedisStore:
    name = "Redis"
    lease = 1.0

    def __init__(self, tmp: Path) -> None:
        binary = shutil.which("redis-server")
        if not binary or not shutil.which("redis-cli"):
            raise RuntimeError("redis-server and redis-cli are needed (apt-get install redis)")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while self.cli("ping") != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        # The store's own record of every write: MONITOR, read on a thread.
        self.writes: list[tuple[float, str, str]] = []  # (wall time, command, key)
        self._monitor = subprocess.Popen(
            ["redis-cli", "-p", str(self.port), "monitor"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read_monitor, daemon=True)
        self._reader.start()
        self._client: redis.Redis | None = None

    _LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] "(\w+)" "([^"]*)"')

    def _read_monitor(self) -> None:
        assert self._monitor.stdout is not None
        for line in self._monitor.stdout:
            match = self._LINE.match(line)
            if match and match.group(3).lower() in ("set", "pexpire"):
                self.writes.append((float(match.group(1)), match.group(3).lower(), match.group(4)))
                del self.writes[:-50000]

    def client(self) -> redis.Redis:
        """A synchronous client in the harness: a write lands within a millisecond of the
        call (``redis-cli`` would add its own start-up, tens of ms)."""
        if self._client is None:
            self._client = redis.Redis.from_url(self.url)
        return self._client

    def url_for(self, slot: str) -> str:
        """Every replica connects to the server itself (no proxy per slot, unlike
        `PostgresStore`)."""
        return self.url

    def cli(self, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True
        ).stdout.strip()

    def stall(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def unstall(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        if self._client is not None:
            self._client.close()
        self._monitor.kill()
        self.proc.kill()
        self.proc.wait()
        self._monitor.wait()


# A grant to another identity in our record format (sidecar/backends/redis/scripts.py): next
# term, a new version, published like every grant.
# KEYS[1] holder, KEYS[2] term counter; ARGV[1] channel, ARGV[2] identity, ARGV[3] version,
# ARGV[4] wall time, ARGV[5] lease ms, ARGV[6] GC ms.
_OURS_TAKEOVER = """
local current = redis.call('GET', KEYS[1])
local term = tonumber(redis.call('GET', KEYS[2]) or '0')
if current then
  local held = cjson.decode(current)
  if held.term and held.term > term then term = held.term end
end
term = term + 1
redis.call('SET', KEYS[2], string.format('%d', term))
local value = cjson.encode({holder = ARGV[2], term = term, duration_ms = tonumber(ARGV[5]),
                            version = ARGV[3], acquired_at = ARGV[4], renewed_at = ARGV[4]})
redis.call('SET', KEYS[1], value, 'PX', ARGV[6])
redis.call('PUBLISH', ARGV[1], value)
return term
"""


class OursOnRedis:
    label = "leader-sidecar"
    ours = True

    def __init__(self, store: RedisStore, lease: str = "bench-ours") -> None:
        self.store = store
        self.lease_name = lease
        self.lease = store.lease
        self.renew = store.lease / 3
        base = f"leader-sidecar:{{{lease}}}"
        self.keys = (f"{base}:holder", f"{base}:term", f"{base}:events")
        self.extra_args: Callable[[str], Sequence[str]] = no_args  # each slot's further flags

    def start(self, name: str, slot: str) -> Replica:
        return SidecarProcess.start(
            name,
            self.store.url_for(f"ours-{slot}"),
            lease_duration=f"{self.lease:g}s",
            args=["--lease", self.lease_name, "--log-level", "info", *self.extra_args(slot)],
        )

    def partition(self, slot: str, cut: bool) -> None:
        self.store.partition(f"ours-{slot}", cut)

    def last_write_before(self, moment: float) -> float | None:
        key = self.keys[0]
        return max(
            (t for t, cmd, k in list(self.store.writes) if k == key and t <= moment),
            default=None,
        )

    def reset(self) -> None:
        self.store.cli("del", self.keys[0], self.keys[1])

    def takeover(self) -> float:
        holder, term, channel = self.keys
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        client = self.store.client()
        client.ping()
        began = time.time()
        client.eval(
            _OURS_TAKEOVER, 2, holder, term, channel, f"intruder_{uuid.uuid4().hex[:8]}",
            uuid.uuid4().hex, stamp, int(self.lease * 1000), int(self.lease * 10000),
        )  # fmt: skip
        return began


class RecipeOnRedis:
    label = "redis-py recipe"
    ours = False

    def __init__(self, store: RedisStore, key: str = "bench-recipe") -> None:
        self.store = store
        self.key = key
        self.lease = store.lease
        self.renew = store.lease / 3

    def start(self, name: str, slot: str) -> Replica:
        args = ["--url", self.store.url, "--key", self.key, "--ttl", f"{self.lease:g}"]
        return AnchorProcess.start("redis_lock", name, args)

    def last_write_before(self, moment: float) -> float | None:
        """The holder's last TTL reset (``pexpire`` in redis-py's reacquire script); the
        followers' failing ``SET NX`` are not writes."""
        return max(
            (
                t
                for t, cmd, k in list(self.store.writes)
                if k == self.key and cmd == "pexpire" and t <= moment
            ),
            default=None,
        )

    def reset(self) -> None:
        self.store.cli("del", self.key)

    def takeover(self) -> float:
        client = self.store.client()
        client.ping()
        began = time.time()
        client.set(self.key, f"intruder-{uuid.uuid4().hex}", px=int(self.lease * 1000))
        return began


# -- SQLite (one file) -----------------------------------------------------------------------


class SqliteStore:
    """One SQLite file in the run's temporary directory: no server to start or stop."""

    name = "SQLite"
    short = "SQLite"
    lease = 1.0

    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:///{tmp / 'leases.db'}"

    def close(self) -> None:
        pass


class OursOnSqlite:
    """Our sidecar on the SQLite file. No store-side write log is kept: the measures that need
    one (`last_write_before`, `takeover`) are not run on it."""

    label = "leader-sidecar"
    ours = True

    def __init__(self, store: SqliteStore, lease: str = "bench-ours") -> None:
        self.store = store
        self.lease_name = lease
        self.lease = store.lease
        self.renew = store.lease / 3
        self.extra_args: Callable[[str], Sequence[str]] = no_args  # each slot's further flags

    def start(self, name: str, slot: str) -> Replica:
        return SidecarProcess.start(
            name,
            self.store.url,
            lease_duration=f"{self.lease:g}s",
            args=["--lease", self.lease_name, "--log-level", "info", *self.extra_args(slot)],
        )

    def last_write_before(self, moment: float) -> float | None:
        raise NotImplementedError("no write log is kept for the SQLite file")

    def reset(self) -> None:
        raise NotImplementedError("start a pool on a new lease name instead")

    def takeover(self) -> float:
        raise NotImplementedError("no takeover measure on the SQLite file")


def describe(system: Any) -> str:
    return json.dumps({"system": system.label, "lease": system.lease, "renew": system.renew})


# -- PostgreSQL -----------------------------------------------------------------------------------

# The store's own record of every write to a lease row, with the server's clock (same host).
_WRITE_LOG = """
CREATE TABLE bench_writes (name text NOT NULL, at timestamptz NOT NULL);
CREATE FUNCTION bench_log_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_writes VALUES (NEW.name, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER bench_log AFTER INSERT OR UPDATE ON leader_sidecar.leases
    FOR EACH ROW EXECUTE FUNCTION bench_log_write();
"""


class PostgresStore:
    name = "PostgreSQL"
    short = "PostgreSQL"
    lease = 1.0

    def __init__(self, tmp: Path) -> None:
        from tests.postgresql.servers import PostgresServer

        self.proxies: dict[str, Any] = {}  # slot → the TcpProxy its replica connects through
        self.server = PostgresServer.start()
        self.server.psql("CREATE DATABASE bench")
        self.url = self.server.url("bench")
        subprocess.run(
            ["python3", "-m", "sidecar", "postgresql-schema", "--store", self.url],
            check=True,
            capture_output=True,
        )
        self.sql(_WRITE_LOG)

    def sql(self, statement: str) -> str:
        return self.server.value(statement, "bench")

    async def open_proxies(self, slots: list[str]) -> None:
        """One proxy per replica slot and system (``ours-0``, ``recipe-0`` …), so one replica
        alone can be cut off (`partition`)."""
        from tests.chaos.proxy import TcpProxy

        for slot in slots:
            self.proxies[slot] = await TcpProxy("127.0.0.1", self.server.port, slot).start()

    async def close_proxies(self) -> None:
        for proxy in self.proxies.values():
            await proxy.stop()

    def url_for(self, slot: str) -> str:
        proxy = self.proxies.get(slot)
        if proxy is None:
            return self.url
        return self.url.replace(f"127.0.0.1:{self.server.port}", proxy.address)

    def partition(self, slot: str, cut: bool) -> None:
        proxy = self.proxies[slot]
        # The proxy's loop is the benchmark's: this runs on it (measures call it directly).
        proxy.set_mode("blackhole" if cut else "open")

    def stall(self) -> None:
        self.server.pause()

    def unstall(self) -> None:
        self.server.resume()

    def close(self) -> None:
        self.server.destroy()


class OursOnPostgres:
    label = "leader-sidecar"
    ours = True

    def __init__(self, store: PostgresStore, lease: str = "bench-ours") -> None:
        self.store = store
        self.lease_name = lease
        self.lease = store.lease
        self.renew = store.lease / 3

    def start(self, name: str, slot: str) -> Replica:
        return SidecarProcess.start(
            name,
            self.store.url_for(f"ours-{slot}"),
            lease_duration=f"{self.lease:g}s",
            args=["--lease", self.lease_name, "--log-level", "info"],
        )

    def partition(self, slot: str, cut: bool) -> None:
        self.store.partition(f"ours-{slot}", cut)

    def last_write_before(self, moment: float) -> float | None:
        value = self.store.sql(
            "SELECT extract(epoch FROM max(at)) FROM bench_writes "
            f"WHERE name = '{self.lease_name}' AND at <= to_timestamp({moment})"
        )
        return float(value) if value else None

    def reset(self) -> None:
        self.store.sql(
            f"DELETE FROM leader_sidecar.leases WHERE name = '{self.lease_name}'; "
            f"DELETE FROM leader_sidecar.grants WHERE name = '{self.lease_name}'"
        )

    def takeover(self) -> float:
        """Another candidate's grant: next term, a new version, announced like every write.
        Returns when the write was made (the store's own log)."""
        intruder = f"intruder_{uuid.uuid4().hex[:8]}"
        value = self.store.sql(
            f"""
            WITH granted AS (
                UPDATE leader_sidecar.leases
                SET holder = '{intruder}', term = term + 1, version = md5(random()::text),
                    released = false, successor = NULL, handed = NULL
                WHERE name = '{self.lease_name}' RETURNING name, term
            ), fenced AS (
                UPDATE leader_sidecar.grants g SET term = granted.term FROM granted
                WHERE g.name = granted.name
            )
            SELECT extract(epoch FROM clock_timestamp()) FROM granted
            """
        )
        return float(value)


class RecipeOnPostgres:
    label = "advisory-lock recipe"
    ours = False

    def __init__(self, store: PostgresStore, key: int = 4242) -> None:
        self.store = store
        self.key = key
        self.lease = store.lease  # its timeouts only: the recipe has no lease
        self.renew = 0.1

    def start(self, name: str, slot: str) -> Replica:
        url = self.store.url_for(f"recipe-{slot}")
        return AnchorProcess.start("pg_advisory_lock", name, ["--url", url, "--key", str(self.key)])

    def partition(self, slot: str, cut: bool) -> None:
        self.store.partition(f"recipe-{slot}", cut)

    def last_write_before(self, moment: float) -> float | None:
        """The lock is free the moment its session ends: the earliest take is ``moment``
        itself (`measures` adds the lease to what this returns)."""
        return moment - self.lease

    def reset(self) -> None:
        pass  # nobody holds the lock once the previous process is gone

    def takeover(self) -> float:
        """What takes a session lock from its holder: its session ended (an operator, a
        failover, a pooler); another replica then takes the lock."""
        value = self.store.sql(
            "SELECT extract(epoch FROM clock_timestamp()) FROM ("
            "SELECT pg_terminate_backend(pid) FROM pg_locks "
            f"WHERE locktype = 'advisory' AND objid = {self.key} AND granted) ended"
        )
        return float(value.splitlines()[0]) if value else time.time()


# -- etcd (a three-member cluster on loopback) ----------------------------------------------------


class EtcdStore:
    """A three-member etcd cluster (tests/etcd/cluster.py); the store's record of writes is a
    watch of everything, each event stamped when it arrives (within a millisecond here)."""

    name = "etcd"
    short = "etcd"
    lease = 1.0

    def __init__(self, tmp: Path) -> None:
        from tests.etcd.cluster import EtcdCluster

        (tmp / "etcd").mkdir()
        self.cluster = EtcdCluster.start(tmp / "etcd", 3)
        self.endpoints = ",".join(m.endpoint for m in self.cluster.members)
        self.writes: list[tuple[float, str]] = []  # (wall time, key)
        self._watch = threading.Thread(target=self._follow, daemon=True)
        self._watch.start()

    def _follow(self) -> None:
        """Every event of the cluster, as it arrives: the store's own record of writes."""
        import base64
        import urllib.request

        body = json.dumps({"create_request": {"key": "AA==", "range_end": "AA=="}}).encode()
        member = self.cluster.members[0]
        request = urllib.request.Request(f"{member.client_url}/v3/watch", data=body)
        with contextlib.suppress(Exception), urllib.request.urlopen(request) as stream:
            for line in stream:
                arrived = time.time()
                result = json.loads(line).get("result") or {}
                for event in result.get("events") or []:
                    key = base64.b64decode(event["kv"]["key"]).decode(errors="replace")
                    self.writes.append((arrived, key))
                del self.writes[:-50000]

    def last_write_before(self, prefix: str, moment: float) -> float | None:
        return max(
            (t for t, k in list(self.writes) if k.startswith(prefix) and t <= moment),
            default=None,
        )

    def delete(self, prefix: str) -> None:
        self.cluster.etcdctl("del", "--prefix", prefix)

    def stall(self) -> None:
        for member in self.cluster.members:
            member.pause()

    def unstall(self) -> None:
        for member in self.cluster.members:
            member.resume()

    def close(self) -> None:
        self.cluster.stop()


class OursOnEtcd:
    label = "leader-sidecar"
    ours = True

    def __init__(self, store: EtcdStore, prefix: str = "bench-ours") -> None:
        self.store = store
        self.prefix = prefix
        self.key = f"{prefix}/lease/default"
        self.lease = store.lease
        self.renew = store.lease / 3

    def start(self, name: str, slot: str) -> Replica:
        return SidecarProcess.start(
            name,
            f"etcd://{self.store.endpoints}/{self.prefix}",
            lease_duration=f"{self.lease:g}s",
            args=["--log-level", "info"],
        )

    def last_write_before(self, moment: float) -> float | None:
        return self.store.last_write_before(self.key, moment)

    def reset(self) -> None:
        self.store.delete(self.key)

    def takeover(self) -> float:
        """A grant to another identity in our record format: the next term, a new version."""
        current = json.loads(
            self.store.cluster.etcdctl("get", "--print-value-only", self.key) or "{}"
        )
        value = json.dumps(
            {
                "holder": f"intruder_{uuid.uuid4().hex[:8]}",
                "term": int(current.get("term") or 0) + 1,
                "duration_ms": int(self.lease * 1000),
                "version": uuid.uuid4().hex[:16],
            }
        )
        # Through the gateway, not etcdctl: a process start would land inside the measure.
        import base64
        import urllib.request

        body = json.dumps(
            {
                "key": base64.b64encode(self.key.encode()).decode(),
                "value": base64.b64encode(value.encode()).decode(),
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.store.cluster.members[0].client_url}/v3/kv/put", data=body
        )
        began = time.time()
        with urllib.request.urlopen(request, timeout=5) as answer:
            answer.read()
        return began


class EtcdctlOnEtcd:
    """etcd's own election (``etcdctl elect``): its session lease is 60 s, fixed by etcdctl."""

    label = "etcdctl elect"
    ours = False
    demotes_on_takeover = False  # it never looks at its key again once it has won

    def __init__(self, store: EtcdStore, election: str = "bench-etcdctl") -> None:
        self.store = store
        self.election = election
        self.lease = 60.0
        self.renew = 20.0  # the session's keep-alive: a third of the lease

    def start(self, name: str, slot: str) -> Replica:
        args = ["--endpoints", self.store.endpoints, "--election", self.election]
        return AnchorProcess.start("etcd_elect", name, args, group=True)

    def last_write_before(self, moment: float) -> float | None:
        """The session lease is kept alive by its own stream, not a write to the key: the
        earliest take is the candidate key's creation + the lease (its keep-alives only push
        it on), so this is a lower bound of when another could win."""
        return self.store.last_write_before(self.election + "/", moment)

    def reset(self) -> None:
        self.store.delete(self.election + "/")

    def takeover(self) -> float:
        raise NotImplementedError("etcdctl elect never looks at its key again once it has won")


# -- ZooKeeper (one standalone server) ---------------------------------------------------------


class ZookeeperStore:
    """One standalone ZooKeeper 3.8 (tests/zookeeper/servers.py: ``tickTime`` 100 ms). Every
    replica of the pools connects through a proxy of its own that reads the wire protocol
    (`benchmarks.zookeeper_frames`): the requests each one sends, and the store's record of
    writes (when each was answered). The start → leader trials connect to the server itself,
    and so does every replica with ``proxies=False``: each frame through a proxy is a hop
    through a thread of the harness, which shares the GIL with the observer (on a hand-off,
    the write, its event and the successor's read: 3-6 ms of the median, `benchmarks.handoffs`
    and `benchmarks.handoff_steps` saw)."""

    name = "ZooKeeper"
    short = "ZooKeeper"
    lease = 1.0

    def __init__(self, tmp: Path, *, proxies: bool = True) -> None:
        from benchmarks.zookeeper_frames import FrameProxies
        from tests.zookeeper.servers import Standalone

        self.server = Standalone.start(tmp / "zookeeper")
        self.proxies = proxies
        self.frames = FrameProxies(("127.0.0.1", self.server.client_port))
        self._kazoo: Any = None

    def endpoint_for(self, slot: str) -> str:
        if slot.endswith("-start") or not self.proxies:
            return self.server.endpoint
        return self.frames.endpoint(slot)

    def kazoo(self) -> Any:
        """A client in the harness (kazoo, synchronous), straight to the server."""
        if self._kazoo is None:
            from kazoo.client import KazooClient

            self._kazoo = KazooClient(hosts=self.server.endpoint, timeout=4.0)
            self._kazoo.start()
        return self._kazoo

    def stall(self) -> None:
        self.server.pause()

    def unstall(self) -> None:
        self.server.resume()

    def through_proxies(self) -> FrameProxies:
        """The proxies' record (requests, writes): only where the replicas go through them."""
        if not self.proxies:
            raise RuntimeError("the replicas connect to ZooKeeper itself: no frame is counted")
        return self.frames

    def close(self) -> None:
        if self.proxies:
            for system in ("ours", "kazoo"):
                print(f"  ZooKeeper requests by type, {system}: {dict(self.frames.ops(system))}")
        with contextlib.suppress(Exception):
            self.server.resume()
        if self._kazoo is not None:
            with contextlib.suppress(Exception):
                self._kazoo.stop()
                self._kazoo.close()
        self.frames.close()
        self.server.kill()


class OursOnZookeeper:
    label = "leader-sidecar"
    ours = True

    def __init__(self, store: ZookeeperStore, lease: str = "bench-ours") -> None:
        self.store = store
        self.lease_name = lease
        self.chroot = f"/{lease}"
        self.path = f"{self.chroot}/leases/{lease}"
        self.lease = store.lease
        self.renew = store.lease / 3

    def start(self, name: str, slot: str) -> Replica:
        endpoint = self.store.endpoint_for(f"ours-{slot}")
        return SidecarProcess.start(
            name,
            f"zookeeper://{endpoint}{self.chroot}",
            lease_duration=f"{self.lease:g}s",
            args=["--lease", self.lease_name, "--log-level", "info"],
        )

    def store_requests(self, slot: str) -> float:
        return self.store.through_proxies().requests(f"ours-{slot}")

    def last_write_before(self, moment: float) -> float | None:
        return self.store.through_proxies().last_write(self.path, moment)

    def reset(self) -> None:
        """The lease, and the candidate records of replicas that are gone: the start → leader
        trials leave ten, which the leader would read on every candidate beat until they are
        collected (20 leases) — not the steady pool of three the other rows measure."""
        from kazoo.exceptions import NoNodeError

        with contextlib.suppress(NoNodeError):
            self.store.kazoo().delete(self.path)
        with contextlib.suppress(NoNodeError):
            self.store.kazoo().delete(f"{self.chroot}/candidates", recursive=True)

    def takeover(self) -> float:
        """A grant to another identity in our record format: the next term, a new version,
        conditional on the znode's data version as a candidate's write is."""
        client = self.store.kazoo()
        for _ in range(20):
            data, stat = client.get(self.path)
            current = json.loads(data or b"{}")
            stamp = datetime.now(UTC).isoformat()
            value = {
                "holder": f"intruder_{uuid.uuid4().hex[:8]}",
                "term": int(current.get("term") or 0) + 1,
                "duration_ms": int(self.lease * 1000),
                "version": uuid.uuid4().hex[:16],
                "acquired_at": stamp,
                "renewed_at": stamp,
            }
            began = time.time()
            try:
                client.set(self.path, json.dumps(value).encode(), version=stat.version)
            except Exception:  # BadVersionError: a renewal landed first; read again
                continue
            return began
        raise RuntimeError("takeover: the lease kept changing")


class KazooOnZookeeper:
    """kazoo's ``Election`` recipe: its session timeout is its lease (1 s, as our lease); the
    leader's session is kept alive by pings, and a crashed leader's lock znode goes when the
    server expires that session."""

    label = "kazoo Election"
    ours = False
    demotes_on_takeover = False  # it never looks at its own lock znode once it has won

    def __init__(self, store: ZookeeperStore, path: str = "/bench-kazoo/election") -> None:
        self.store = store
        self.election = path
        self.lease = store.lease  # the session timeout
        self.renew = store.lease / 3  # kazoo pings at most every third of it (jittered)

    def start(self, name: str, slot: str) -> Replica:
        endpoint = self.store.endpoint_for(f"kazoo-{slot}")
        args = ["--hosts", endpoint, "--path", self.election, "--timeout", f"{self.lease:g}"]
        return AnchorProcess.start("kazoo_election", name, args)

    def store_requests(self, slot: str) -> float:
        return self.store.through_proxies().requests(f"kazoo-{slot}")

    def last_write_before(self, moment: float) -> float | None:
        """The lock holder's session's last frame (a ping or a request) before ``moment``:
        the server expires the session, and deletes the holder's znode, a session timeout
        after the last frame it received."""
        return self.store.through_proxies().holder_last_heard(self.election, moment)

    def reset(self) -> None:
        """No contender left: a killed one's znode would stay until its session expires."""
        from kazoo.exceptions import NoNodeError

        with contextlib.suppress(NoNodeError):
            self.store.kazoo().delete(self.election, recursive=True)

    def takeover(self) -> float:
        raise NotImplementedError("the recipe never looks at its own lock znode once it has won")
