"""Start at the floor: spawn → first answer and spawn → leader of our sidecar on each store,
beside a bare aiohttp + prometheus_client app answering one route (`anchors/bare_app.py`), the
least any HTTP server with metrics in Python costs to start here. The two (three with
``--before``) start alternately, one at a time, ``--trials`` times per store, in a rotating
order, so all of them see the same machine.

    python -m benchmarks.start_floor [--stores sqlite,redis,…] [--trials 20] [--before DIR]

``--before DIR`` also starts the sidecar of another checkout (an export of an older commit) in
each trial: before and after measured in the same run. Each start of ours is on an empty lease
(a new lease name per start); spawn → leader is until ``/leader`` answers 200. A store's round
trip is measured from this process with a warm connection (median of 20): the target for
spawn → leader is the first answer plus two of them. Answers are read with a raw socket polled
every 2 ms; the CPU time the process had used by its first answer is read from /proc.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.processes import REPO, compile_bytecode

POLL = 0.002
TIMEOUT = 20.0
ALL_STORES = ("sqlite", "redis", "postgresql", "etcd", "kubernetes", "zookeeper")


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ask(port: int) -> tuple[int, bytes] | None:
    """``GET /leader`` once: (status, body); None when nothing listens yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            sock.sendall(b"GET /leader HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    answer = b"".join(chunks)
    if not answer.startswith(b"HTTP/1."):
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Start:
    first_answer: float
    cpu: float
    first_status: int
    first_body: bytes
    leader: float | None = None


def start_once(command: Sequence[str], cwd: Path, env: dict[str, str], port: int,
               until_leader: bool) -> Start:  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = began + TIMEOUT
        start: Start | None = None
        while time.monotonic() < deadline:
            answer = _ask(port)
            now = time.monotonic()
            if answer is not None:
                if start is None:
                    start = Start(now - began, _cpu(proc.pid), answer[0], answer[1])
                if answer[0] == 200 or not until_leader:
                    if until_leader:
                        start.leader = now - began
                    return start
            elif proc.poll() is not None:
                assert proc.stderr is not None
                raise RuntimeError(f"{command[:4]} exited: {proc.stderr.read()[-2000:]!r}")
            time.sleep(POLL)
        raise TimeoutError(f"{command[:4]}: no {'leader' if start else 'answer'}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _environment(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["PYTHONPATH"] = str(tree)
    return env


# -- the stores ----------------------------------------------------------------------------------


class Store:
    name: str

    def args(self, lease: str) -> list[str]:
        """``--store …`` and whatever else this store needs for a lease named ``lease``."""
        raise NotImplementedError

    def round_trip(self) -> float:
        """One request of this process to the store on a warm connection, in seconds."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class SqliteStore(Store):
    name = "SQLite"

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "leases.db"
        self._db: sqlite3.Connection | None = None

    def args(self, lease: str) -> list[str]:
        return ["--store", f"sqlite:///{self.path}", "--lease", lease]

    def round_trip(self) -> float:
        """One durable write, as a lease write is: a row updated in a ``BEGIN IMMEDIATE``
        transaction, WAL and ``synchronous=FULL`` as the store sets them, in a scratch file
        beside the store's (the store's own file is left to the sidecars)."""
        if self._db is None:
            self._db = sqlite3.connect(self.path.with_name("round-trip.db"), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v INTEGER)")
            self._db.execute("INSERT OR IGNORE INTO t VALUES (1, 0)")
        began = time.perf_counter()
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("UPDATE t SET v = v + 1 WHERE k = 1")
        self._db.execute("COMMIT")
        return time.perf_counter() - began

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


class RedisStore(Store):
    name = "Redis"

    def __init__(self, tmp: Path) -> None:
        import redis

        from benchmarks.systems import RedisStore as Server

        self.server = Server(tmp)
        self.client = redis.Redis.from_url(self.server.url)

    def args(self, lease: str) -> list[str]:
        return ["--store", self.server.url, "--lease", lease]

    def round_trip(self) -> float:
        began = time.perf_counter()
        self.client.ping()
        return time.perf_counter() - began

    def close(self) -> None:
        self.client.close()
        self.server.close()


class PostgresStore(Store):
    name = "PostgreSQL"

    def __init__(self, tmp: Path) -> None:
        import asyncio

        import asyncpg

        from benchmarks.systems import PostgresStore as Server

        self.server = Server(tmp)
        # A loop of its own, not an asyncio.Runner: a Runner takes SIGINT over for as long as
        # it lives, and Ctrl-C would no longer stop the run (nor clean the servers up).
        self.loop = asyncio.new_event_loop()
        self.db = self.loop.run_until_complete(asyncpg.connect(self.server.url))

    def args(self, lease: str) -> list[str]:
        return ["--store", self.server.url, "--lease", lease]

    def round_trip(self) -> float:
        began = time.perf_counter()
        self.loop.run_until_complete(self.db.fetchval("SELECT 1"))
        return time.perf_counter() - began

    def close(self) -> None:
        self.loop.run_until_complete(self.db.close())
        self.loop.close()
        self.server.close()


class _HttpStore(Store):
    """A store spoken to over HTTP: the round trip is one request on a kept-alive connection."""

    def __init__(self, url: str) -> None:
        import http.client
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)

    def request(self) -> tuple[str, str, bytes | None]:
        raise NotImplementedError

    def round_trip(self) -> float:
        method, path, body = self.request()
        began = time.perf_counter()
        self.http.request(method, path, body)
        self.http.getresponse().read()
        return time.perf_counter() - began


class EtcdStore(_HttpStore):
    """One member (a raft of one; the request is a linearizable read through the gateway)."""

    name = "etcd"

    def __init__(self, tmp: Path) -> None:
        from tests.etcd.cluster import EtcdCluster

        (tmp / "etcd").mkdir()
        self.cluster = EtcdCluster.start(tmp / "etcd", 1)
        super().__init__(self.cluster.members[0].client_url)

    def args(self, lease: str) -> list[str]:
        return ["--store", self.cluster.url(f"start/{lease}")]

    def request(self) -> tuple[str, str, bytes | None]:
        return "POST", "/v3/kv/range", json.dumps({"key": "c3RhcnQ="}).encode()

    def close(self) -> None:
        self.http.close()
        self.cluster.stop()


class KubeStore(_HttpStore):
    """The fake API server in its own process."""

    name = "Kubernetes (fake)"
    namespace = "demo"

    def __init__(self, tmp: Path) -> None:
        from tests.fakekube import FakeKubeProcess

        self.fake = FakeKubeProcess.start()
        self.kubeconfig = self.fake.kubeconfig(tmp / "kubeconfig", self.namespace)
        super().__init__(self.fake.url)

    def args(self, lease: str) -> list[str]:
        return [
            "--store", "kubernetes", "--kubeconfig", str(self.kubeconfig),
            "--namespace", self.namespace, "--lease", lease,
        ]  # fmt: skip

    def request(self) -> tuple[str, str, bytes | None]:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/none"
        return "GET", path, None

    def close(self) -> None:
        self.http.close()
        self.fake.stop()


class ZookeeperStore(Store):
    """One standalone server (tests/zookeeper/servers.py); the round trip is ``ruok`` on a new
    connection, so it overstates a request on the sidecar's open session."""

    name = "ZooKeeper"

    def __init__(self, tmp: Path) -> None:
        from tests.zookeeper.servers import Standalone

        (tmp / "zookeeper").mkdir()
        self.server = Standalone.start(tmp / "zookeeper")

    def args(self, lease: str) -> list[str]:
        return ["--store", self.server.url(f"/start-{lease}"), "--lease", lease]

    def round_trip(self) -> float:
        from tests.zookeeper.servers import four_letter

        began = time.perf_counter()
        four_letter(self.server.client_port, "ruok")
        return time.perf_counter() - began

    def close(self) -> None:
        self.server.kill()


STORES: dict[str, Callable[[Path], Store]] = {
    "sqlite": SqliteStore,
    "redis": RedisStore,
    "postgresql": PostgresStore,
    "etcd": EtcdStore,
    "kubernetes": KubeStore,
    "zookeeper": ZookeeperStore,
}


# -- the trials ----------------------------------------------------------------------------------


@dataclass
class Series:
    label: str
    starts: list[Start] = field(default_factory=list)


def _sidecar(tree: Path, store: Store, lease: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "sidecar", *store.args(lease), "--identity", lease,
        "--lease-duration", "3s", "--listen", f"127.0.0.1:{port}",
        "--public-listen", "127.0.0.1:0",
    ]  # fmt: skip


def run_store(store: Store, trees: dict[str, Path], trials: int) -> tuple[list[Series], float]:
    bare = Series("bare app")
    ours = {label: Series(label) for label in trees}
    runs: list[tuple[Series, Callable[[int], Start]]] = []

    def bare_start(i: int) -> Start:
        port = _free_port()
        command = [sys.executable, "-m", "benchmarks.anchors.bare_app", "--port", str(port)]
        return start_once(command, REPO, _environment(REPO), port, until_leader=False)

    runs.append((bare, bare_start))
    for label, tree in trees.items():

        def our_start(i: int, label: str = label, tree: Path = tree) -> Start:
            port = _free_port()
            lease = f"{label}-{i}-{os.getpid()}"
            command = _sidecar(tree, store, lease, port)
            return start_once(command, tree, _environment(tree), port, until_leader=True)

        runs.append((ours[label], our_start))
    for i in range(trials):
        turn = i % len(runs)
        for series, one in runs[turn:] + runs[:turn]:
            series.starts.append(one(i))
    trips = [store.round_trip() for _ in range(21)][1:]
    return [bare, *ours.values()], statistics.median(trips)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def rows(store: Store, series: list[Series], trip: float) -> list[str]:
    bare = statistics.median(s.first_answer for s in series[0].starts)
    bare_cpu = statistics.median(s.cpu for s in series[0].starts)
    lines = []
    for one in series:
        first = [s.first_answer for s in one.starts]
        cpu = statistics.median(s.cpu for s in one.starts)
        leader = [s.leader for s in one.starts if s.leader is not None]
        gaps = [s.leader - s.first_answer for s in one.starts if s.leader is not None]
        starting = sum(b'"starting": true' in s.first_body for s in one.starts)
        median_first = statistics.median(first)
        cells = [
            store.name,
            one.label,
            f"{_ms(median_first)} / {_ms(_p90(first))}",
            f"{median_first / bare:.2f}",
            f"{_ms(cpu)}",
            f"{cpu / bare_cpu:.2f}",
            f"{_ms(statistics.median(leader))} / {_ms(_p90(leader))}" if leader else "-",
            f"{statistics.median(gaps) * 1000:.1f} / {_p90(gaps) * 1000:.1f}" if gaps else "-",
            f"{2 * trip * 1000:.2f}" if leader else "-",
            f"{starting} of {len(one.starts)}" if leader else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


HEADER = [
    "| store | process | spawn → first answer, median / p90 (ms) | ÷ bare app's "
    "| CPU by first answer, median (ms) | ÷ bare app's | spawn → leader, median / p90 (ms) "
    "| leader - first answer, median / p90 (ms) | two store round trips (ms) "
    '| first answers saying "starting" |',
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stores", default=",".join(ALL_STORES))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--before", type=Path, help="another checkout, started in each trial")
    args = parser.parse_args()
    trees = {"sidecar": REPO}
    if args.before is not None:
        trees = {"before": args.before.resolve(), "after": REPO}
    for tree in trees.values():
        compile_bytecode(tree)
    table = list(HEADER)
    loads = [os.getloadavg()[0]]
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        for name in args.stores.split(","):
            if name not in STORES:
                raise SystemExit(f"--stores: unknown store {name!r} ({', '.join(STORES)})")
            tmp = Path(tmp_name) / name
            tmp.mkdir()
            try:
                store = STORES[name](tmp)
            except Exception as exc:  # a server this machine lacks: the row says so
                print(f"[{name}] not measured: {exc}", flush=True)
                continue
            try:
                series, trip = run_store(store, trees, args.trials)
            finally:
                store.close()
            loads.append(os.getloadavg()[0])
            lines = rows(store, series, trip)
            print("\n".join(lines), flush=True)
            table += lines
    print()
    print("\n".join(table))
    print(
        f"\n{args.trials} trials per store, {os.cpu_count()} CPUs, load average (1 min) "
        f"{min(loads):.2f}-{max(loads):.2f}, {time.monotonic() - began:.0f} s; "
        f"{shutil.which('python3')} {sys.version.split()[0]}"
    )


if __name__ == "__main__":
    main()
