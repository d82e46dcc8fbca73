"""Renewals under a flood of API requests (issue 10): run on purpose, never in CI.

    python -m benchmarks.flood [--seconds 30] [--connections 1000] [--waiters 2000]

One leader (SQLite store, lease 3 s, renew 1 s) pinned to CPU 0 together with the whole load:
`wrk` on the localhost ``GET /leader`` and on the public ``GET /metrics``, plus long-polls and
SSE streams held open by a Python client. An outside observer on CPU 1 reads the lease row
every 5 ms and times the gaps between renewals as the store saw them (``renewed_at`` is
written by the sidecar's own write). Prints the gap percentiles without load and under load,
the half-lease alerts and demotions the sidecar counted, and what wrk got.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp

from tests.support.sidecars import SidecarProcess

# ruff: noqa: ASYNC220  (a benchmark driver: blocking Popen of wrk is fine here)

LEASE, RENEW = "3s", "1s"


def renewal_gaps(db: Path, seconds: float) -> list[float]:
    """Seconds between consecutive renewals, from the row's ``renewed_at``."""
    conn = sqlite3.connect(db, timeout=5)
    stamps: list[float] = []
    last = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(sqlite3.OperationalError):
            row = conn.execute("SELECT version, renewed_at FROM leases").fetchone()
            if row and row[0] != last and row[1]:
                last = row[0]
                stamps.append(datetime.fromisoformat(row[1]).timestamp())
        time.sleep(0.005)
    conn.close()
    return [b - a for a, b in itertools.pairwise(stamps)]


def limit_cpu(pid: int, cpus: float) -> Path:
    """A cgroup (v1 ``cpu`` controller) that gives ``pid`` at most ``cpus`` CPUs, like a
    container's CPU limit."""
    group = Path("/sys/fs/cgroup/cpu") / f"leader-sidecar-flood-{pid}"
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    (group / "cgroup.procs").write_text(str(pid))
    return group


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def hold_waiters(local: str, public: str, count: int, seconds: float) -> dict[str, int]:
    """Long-polls and SSE streams held open (half each, over both listeners)."""
    outcome = {"held": 0, "refused": 0, "failed": 0}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            host = local if i % 2 else public
            path = "/events" if i % 4 < 2 and host == local else "/leader?wait=300"
            try:
                async with session.get(
                    f"http://{host}{path}",
                    headers={"If-None-Match": '"x"'},
                    timeout=aiohttp.ClientTimeout(total=seconds + 5),
                ) as response:
                    if response.status == 503 and "Retry-After" in response.headers:
                        outcome["refused"] += 1
                        return
                    outcome["held"] += 1
                    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                        async with asyncio.timeout(seconds):
                            async for _ in response.content.iter_any():
                                pass
            except (aiohttp.ClientError, TimeoutError, OSError):
                outcome["failed"] += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return outcome


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--waiters", type=int, default=2000)
    parser.add_argument(
        "--cpu-quota",
        type=float,
        default=0.0,
        help="also cap the sidecar at this many CPUs with a cgroup (v1 cpu controller), e.g. 0.25",
    )
    parser.add_argument("--hold", nargs=2, metavar=("LOCAL", "PUBLIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        print(await hold_waiters(*args.hold, args.waiters, args.seconds))
        return
    os.sched_setaffinity(0, {1})  # the observer reads from the other CPU
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "flood.db"
        sidecar = SidecarProcess.start(
            "flood",
            f"sqlite:///{db}",
            lease_duration=LEASE,
            args=["--renew-interval", RENEW, "--log-level", "info"],
            prefix=["taskset", "-c", "0"],
        )
        cgroup = limit_cpu(sidecar.proc.pid, args.cpu_quota) if args.cpu_quota else None
        try:
            await asyncio.sleep(2)
            quiet = await asyncio.to_thread(renewal_gaps, db, 10)
            wrk = [
                subprocess.Popen(
                    [
                        "taskset",
                        "-c",
                        "0",
                        "wrk",
                        "-t1",
                        f"-c{args.connections}",
                        f"-d{int(args.seconds)}s",
                        "--timeout",
                        "2s",
                        url,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for url in (f"http://{sidecar.local}/leader", f"http://{sidecar.public}/metrics")
            ]
            waiters = subprocess.Popen(  # the waiters' client shares CPU 0 too
                [
                    "taskset",
                    "-c",
                    "0",
                    sys.executable,
                    "-m",
                    "benchmarks.flood",
                    "--hold",
                    sidecar.local,
                    sidecar.public,
                    "--waiters",
                    str(args.waiters),
                    "--seconds",
                    str(args.seconds),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            loaded = await asyncio.to_thread(renewal_gaps, db, args.seconds)
            held = waiters.communicate()[0].strip()
            outputs = [p.communicate()[0] for p in wrk]
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://{sidecar.public}/metrics") as response,
            ):
                metrics = await response.text()
        finally:
            sidecar.stop()
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
    capped = f", capped at {args.cpu_quota} CPU by a cgroup" if args.cpu_quota else ""
    print(f"leader pinned to CPU 0 with the load{capped}; lease {LEASE}, renew {RENEW}")
    print("| renewal gaps (s) | n | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    for label, gaps in (("no load", quiet), ("under the flood", loaded)):
        print(
            f"| {label} | {len(gaps)} | {statistics.median(gaps):.3f} | "
            f"{percentile(gaps, 0.99):.3f} | {max(gaps):.3f} |"
        )
    print(
        "half-lease alerts:",
        metric(metrics, "leader_sidecar_renewal_gap_over_half_lease_total"),
        "| demotions:",
        metric(metrics, "leader_sidecar_demotions_total"),
        "| still leader:",
        metric(metrics, "leader_sidecar_is_leader"),
    )
    print("waiters:", held)
    for url, out in zip(("/leader", "/metrics"), outputs, strict=True):
        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        errors = re.search(r"Socket errors: (.*)", out)
        print(
            f"wrk {url}: {rate.group(1) if rate else '?'} req/s, non-2xx "
            f"{non2xx.group(1) if non2xx else 0}, socket errors: "
            f"{errors.group(1) if errors else 'none'}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
