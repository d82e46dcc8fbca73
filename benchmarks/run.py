"""Benchmarks: run on purpose, never in CI. Prints one table per store.

    python -m benchmarks.run                 # SQLite, and Redis if redis-server is installed
    python -m benchmarks.run --lease 2s --rounds 5 --stores sqlite

What it measures, on real sidecar processes (3 replicas unless said otherwise):

- failover after a crash: SIGKILL the leader → first 200 from another replica
- hand-off after a release: SIGTERM the leader → first 200 from another replica
- demotion latency: the store stalls (SQLite: another process holds the write lock; Redis:
  SIGSTOP) → the leader's first 503, next to the bound it promises (lease - safety margin
  after its last renewal) and the earliest the store could let another replica in
- /leader requests per second and latency (wrk if installed, else an aiohttp client)
- store requests per second per replica in steady state (from the metrics)
- RSS of each sidecar
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp

from sidecar.config import Timing, parse_duration
from tests.support.sidecars import LeaderObserver, SidecarProcess

Row = tuple[str, str]


# -- stores -------------------------------------------------------------------------------------


class Store:
    name = ""
    url = ""

    def stall(self) -> None: ...

    def unstall(self) -> None: ...

    def close(self) -> None: ...


class SQLiteStore(Store):
    name = "sqlite"

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "bench.db"
        self.url = f"sqlite:///{self.path}"
        self._release = threading.Event()
        self._holder: threading.Thread | None = None

    def stall(self) -> None:
        """Hold SQLite's write lock from another process's point of view: every renewal then
        fails with 'database is locked' after its busy timeout."""
        locked = threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            conn.execute("BEGIN EXCLUSIVE")
            locked.set()
            self._release.wait()
            conn.execute("ROLLBACK")
            conn.close()

        self._release.clear()
        self._holder = threading.Thread(target=hold, daemon=True)
        self._holder.start()
        locked.wait(10)

    def unstall(self) -> None:
        self._release.set()
        if self._holder:
            self._holder.join(10)


class RedisStore(Store):
    name = "redis"

    def __init__(self, tmp: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary
        with contextlib.closing(__import__("socket").socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
            ).stdout.strip()
            != "PONG"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def stall(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def unstall(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


STORES: dict[str, Callable[[Path], Store]] = {"sqlite": SQLiteStore}
if shutil.which("redis-server") and shutil.which("redis-cli"):
    STORES["redis"] = RedisStore


# -- measurements --------------------------------------------------------------------------------


@contextlib.contextmanager
def replicas(store: Store, count: int, lease: str, prefix: str) -> Iterator[list[SidecarProcess]]:
    procs = []
    try:
        for i in range(count):
            procs.append(SidecarProcess.start(f"{prefix}{i}", store.url, lease_duration=lease))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@contextlib.asynccontextmanager
async def observed(procs: list[SidecarProcess]) -> AsyncIterator[LeaderObserver]:
    async with LeaderObserver(procs) as observer:
        yield observer
        overlaps = observer.two_leaders_at_once()
        if overlaps:
            raise AssertionError(f"two leaders at once during the benchmark: {overlaps[:2]}")


async def hand_over(store: Store, lease: str, signum: int, rounds: int) -> list[float]:
    times = []
    for round_ in range(rounds):
        with replicas(store, 3, lease, f"r{round_}-") as procs:
            async with observed(procs) as observer:
                first = await observer.leader(timeout=30)
                leader = next(p for p in procs if p.name == first.name)
                began = time.time()
                leader.signal(signum)
                successor = await observer.wait_for(
                    lambda s, f=first.name, t=began: s.leader and s.name != f and s.sent >= t,
                    timeout=60,
                )
                times.append(successor.received - began)
    return times


async def demotion(store: Store, lease: str, rounds: int) -> list[tuple[float, float]]:
    """(seconds from stall to the leader's first 503, seconds it had promised at most)."""
    timing = Timing.build(parse_duration(lease))
    results = []
    for round_ in range(rounds):
        with replicas(store, 1, lease, f"d{round_}-") as procs:
            async with observed(procs) as observer:
                await observer.leader(timeout=30)
                await asyncio.sleep(timing.renew_interval * 1.5)
                last_renewal_bound = time.time()  # a renewal happened within one interval
                store.stall()
                stalled = time.time()
                try:
                    answer = await observer.wait_for(
                        lambda s, t=stalled: s.status == 503 and s.sent >= t, timeout=60
                    )
                finally:
                    store.unstall()
                promised = timing.lease_duration - timing.safety_margin
                results.append(
                    (answer.received - stalled, promised - (stalled - last_renewal_bound))
                )
    return results


async def leader_throughput(sidecar: SidecarProcess, seconds: float = 5.0) -> Row:
    url = f"http://{sidecar.local}/leader"
    wrk = shutil.which("wrk")
    if wrk:
        finished = await asyncio.to_thread(
            subprocess.run,
            [wrk, "-t2", "-c32", f"-d{int(seconds)}s", "--latency", url],
            capture_output=True,
            text=True,
            check=True,
        )
        out = finished.stdout
        rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
        p50 = re.search(r"50%\s+([\d.]+\w+)", out)
        p99 = re.search(r"99%\s+([\d.]+\w+)", out)
        return (
            f"{float(rps.group(1)):,.0f} req/s (wrk -t2 -c32)" if rps else "?",
            f"p50 {p50.group(1) if p50 else '?'}, p99 {p99.group(1) if p99 else '?'}",
        )
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:
        end = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < end:
                began = time.perf_counter()
                async with session.get(url) as response:
                    await response.read()
                latencies.append(time.perf_counter() - began)

        await asyncio.gather(*(worker() for _ in range(16)))
    latencies.sort()
    return (
        f"{len(latencies) / seconds:,.0f} req/s (aiohttp client, 16 workers)",
        f"p50 {latencies[len(latencies) // 2] * 1000:.2f}ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.2f}ms",
    )


async def store_rate(procs: list[SidecarProcess], seconds: float) -> list[float]:
    async def total(proc: SidecarProcess) -> float:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{proc.public}/metrics") as response,
        ):
            text = await response.text()
        return sum(
            float(m.group(1))
            for m in re.finditer(
                r"^leader_sidecar_store_requests_total\{[^}]*\} ([\d.e+]+)$", text, re.M
            )
        )

    before = [await total(p) for p in procs]
    await asyncio.sleep(seconds)
    after = [await total(p) for p in procs]
    return [(b - a) / seconds for a, b in zip(before, after, strict=True)]


def rss_mib(proc: SidecarProcess) -> float:
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def spread(values: list[float], unit: str = "s") -> str:
    if not values:
        return "-"
    if unit == "ms":
        return (
            f"median {statistics.median(values) * 1000:.0f} ms, "
            f"max {max(values) * 1000:.0f} ms (n={len(values)})"
        )
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s (n={len(values)})"


async def bench(store_name: str, lease: str, rounds: int) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        store = STORES[store_name](Path(tmp))
        try:
            rows: list[Row] = []
            rows.append(
                (
                    "failover after SIGKILL",
                    spread(await hand_over(store, lease, signal.SIGKILL, rounds)),
                )
            )
            rows.append(
                (
                    "hand-off after SIGTERM (release)",
                    spread(await hand_over(store, lease, signal.SIGTERM, rounds), "ms"),
                )
            )
            demoted = await demotion(store, lease, rounds)
            rows.append(
                (
                    "demotion after the store stalls",
                    spread([d for d, _ in demoted])
                    + f"; promised ≤ {max(p for _, p in demoted):.2f} s",
                )
            )
            with replicas(store, 3, lease, "s-") as procs:
                async with observed(procs) as observer:
                    first = await observer.leader(timeout=30)
                leader = next(p for p in procs if p.name == first.name)
                rows.append(("/leader on the leader", " — ".join(await leader_throughput(leader))))
                rates = await store_rate(procs, 10.0)
                note = (
                    " (plus the SQLite watch: one local PRAGMA data_version read per 50 ms)"
                    if store.name == "sqlite"
                    else ""
                )
                rows.append(
                    (
                        "store requests per replica",
                        ", ".join(
                            f"{p.name}{' (leader)' if p is leader else ''} {r:.2f}/s"
                            for p, r in zip(procs, rates, strict=True)
                        )
                        + note,
                    )
                )
                rows.append(("RSS per sidecar", ", ".join(f"{rss_mib(p):.0f} MiB" for p in procs)))
            return rows
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease", default="2s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", default=",".join(STORES))
    args = parser.parse_args()
    for name in args.stores.split(","):
        rows = asyncio.run(bench(name, args.lease, args.rounds))
        print(f"\n### store: {name}, lease {args.lease}, 3 replicas\n")
        print("| measure | result |\n|---|---|")
        for measure, result in rows:
            print(f"| {measure} | {result} |")


if __name__ == "__main__":
    main()
