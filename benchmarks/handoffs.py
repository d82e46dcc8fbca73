"""Hand-off after SIGTERM, our sidecar alone, on every store: many trials in minutes.

    python -m benchmarks.handoffs --stores sqlite,redis,postgresql,etcd,kubernetes --trials 20

`benchmarks.run` measures the hand-off beside an anchor, among every other row; on etcd its
anchor's 60 s session makes 20 trials of the whole table take hours. This runs only the
hand-off (`measures.handoff`: SIGTERM of the leader once the pool is quiet → the successor's
reign; the killed replica replaced), on the same stores and timings as `benchmarks.run`, and
prints the median and p99 per store with the load average around each store's trials.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import measures
from benchmarks.measures import Pool
from benchmarks.processes import compile_bytecode
from benchmarks.report import duration, p99
from benchmarks.systems import (
    EtcdStore,
    KubeStore,
    OursOnEtcd,
    OursOnKube,
    OursOnPostgres,
    OursOnRedis,
    OursOnSqlite,
    OursOnZookeeper,
    PostgresStore,
    RedisStore,
    SqliteStore,
    System,
    ZookeeperStore,
)

STORES = {
    "sqlite": (SqliteStore, OursOnSqlite),
    "redis": (RedisStore, OursOnRedis),
    "postgresql": (PostgresStore, OursOnPostgres),
    "etcd": (EtcdStore, OursOnEtcd),
    "kubernetes": (KubeStore, OursOnKube),
    # Straight to the server: the frame proxies (request counts, the write record for the
    # crash trials) would put a hop through the harness on each frame of the hand-off.
    "zookeeper": (functools.partial(ZookeeperStore, proxies=False), OursOnZookeeper),
}


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


async def one_store(name: str, trials: int, tmp: Path) -> str:
    store_class, ours_class = STORES[name]
    (tmp / name).mkdir()
    store = store_class(tmp / name)  # type: ignore[abstract]
    try:
        system: System = ours_class(store)  # type: ignore[arg-type]
        load_before = _load()
        async with Pool(system) as pool:
            results = [await measures.handoff(pool, quiet_for=[pool]) for _ in range(trials)]
        load_after = _load()
    finally:
        store.close()
    print(f"[{time.strftime('%H:%M:%S')}] {name} hand-off: {results}", flush=True)
    done = [r for r in results if r is not None]
    missed = len(results) - len(done)
    summary = (f"{duration(statistics.median(done))} / {duration(p99(done))}" if done else "—") + (
        f" ({missed} without a successor)" if missed else ""
    )
    return f"| {name} | lease {system.lease:g} s | {summary} | {load_before} → {load_after} |"


async def main_async(args: argparse.Namespace) -> str:
    lines = [
        "| store | timing | hand-off median / p99 (nearest rank) | load (1 min) before → after |",
        "|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp_name:
        for name in args.stores.split(","):
            if name not in STORES:
                raise SystemExit(f"--stores: unknown store {name!r} ({', '.join(STORES)})")
            lines.append(await one_store(name, args.trials, Path(tmp_name)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stores", default="sqlite,redis,postgresql,etcd,kubernetes")
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    compile_bytecode()
    began = time.monotonic()
    text = asyncio.run(main_async(args))
    print()
    print(text)
    print(
        f"\n{args.trials} trials per store, {os.cpu_count()} CPUs, "
        f"{time.monotonic() - began:.0f} s; command: python -m benchmarks.handoffs "
        f"--stores {args.stores} --trials {args.trials}"
    )


if __name__ == "__main__":
    main()
