"""Benchmarks: run on purpose, never in CI. Prints one table: our sidecar beside the anchors,
on the same store and timing, in the same run.

    python -m benchmarks.run                       # both stores, 10 trials per measure
    python -m benchmarks.run --stores redis --trials 3

Kubernetes (the in-repo fake API server, its own process; lease 3 s, renew 1 s — the shortest
the official elector takes): our sidecar vs the official client's elector
(``kubernetes.aio.leaderelection`` + ``LeaseLock``, `benchmarks/anchors/k8s_elector.py`).
Redis (one redis-server; lease 1 s, renew every 1/3 s): our sidecar vs the redis-py ``Lock``
recipe (`benchmarks/anchors/redis_lock.py`). etcd (``--stores etcd``, not in the default set:
three members, lease 1 s): our sidecar vs ``etcdctl elect`` (`benchmarks/anchors/etcd_elect.py`;
its session lease is 60 s, fixed by etcdctl). ZooKeeper (``--stores zookeeper``, not in the
default set: one standalone 3.8 server, lease 1 s): our sidecar vs kazoo's ``Election`` recipe
(`benchmarks/anchors/kazoo_election.py`, session timeout 1 s), each replica behind a proxy
that counts its requests (`benchmarks/zookeeper_frames.py`). Three replicas of each, real
processes, polled by the same observer; see `benchmarks/measures.py` for what each row measures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from benchmarks import measures
from benchmarks.measures import Pool
from benchmarks.processes import AnchorProcess, compile_bytecode
from benchmarks.report import Cell, Row, table
from benchmarks.systems import (
    EtcdctlOnEtcd,
    EtcdStore,
    KazooOnZookeeper,
    KubeStore,
    OfficialOnKube,
    OursOnEtcd,
    OursOnKube,
    OursOnPostgres,
    OursOnRedis,
    OursOnZookeeper,
    PostgresStore,
    RecipeOnPostgres,
    RecipeOnRedis,
    RedisStore,
    System,
    ZookeeperStore,
)

AnyStore = KubeStore | RedisStore | PostgresStore | EtcdStore | ZookeeperStore


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


async def _trials(label: str, trials: int, one: Callable[[int], object]) -> list[object]:
    results = []
    for i in range(trials):
        results.append(await one(i))  # type: ignore[misc]
    _log(f"{label}: {results}")
    return results


async def bench_store(store: AnyStore, ours: System, theirs: System, trials: int,
                      throughput: bool, tmp: Path) -> list[Row]:  # fmt: skip
    short = getattr(store, "short", "K8s" if isinstance(store, KubeStore) else "Redis")
    rows: list[Row] = []
    # start → leader: one process on an empty lease, ours and theirs alternately
    starts: dict[str, list[float]] = {"ours": [], "theirs": []}
    for i in range(trials):
        starts["ours"].append(await measures.start_to_leader(ours, str(i)))
        starts["theirs"].append(await measures.start_to_leader(theirs, str(i)))
    _log(f"{short} start→leader: {starts}")
    ours.reset()
    theirs.reset()
    partitions = isinstance(store, PostgresStore)
    if partitions:
        slots = ["0", "1", "2"]
        await store.open_proxies([f"{who}-{s}" for who in ("ours", "recipe") for s in slots])
    async with Pool(ours) as po, Pool(theirs) as pt:
        pools = [po, pt]

        async def both(trial: Callable[[Pool], object]) -> tuple[object, object]:
            a, b = await asyncio.gather(trial(po), trial(pt))  # type: ignore[arg-type]
            return a, b

        async def in_turn(i: int, trial: Callable[[Pool], object]) -> tuple[object, object]:
            """One after the other, first ours or theirs by turns: a hand-off takes a few
            milliseconds, and side by side the other pool's replacement process (a second of
            CPU to start) or its own hand-off would land inside it on 2 cores. Each hand-off
            also waits for both pools to be quiet (`measures.quiet`)."""
            results: dict[int, object] = {}
            for pool in (pt, po) if i % 2 else (po, pt):
                results[id(pool)] = await trial(pool)  # type: ignore[misc]
            return results[id(po)], results[id(pt)]

        rates = await _trials(f"{short} store rates", trials, lambda i: both(measures.store_rates))
        crashes = await _trials(f"{short} crash", trials, lambda i: both(measures.crash))

        def quiet_handoff(pool: Pool) -> object:
            return measures.handoff(pool, quiet_for=pools)

        handoffs = await _trials(f"{short} hand-off", trials, lambda i: in_turn(i, quiet_handoff))

        async def takeover_both(i: int) -> tuple[object, object]:
            if getattr(theirs, "demotes_on_takeover", True):
                return await both(measures.takeover)
            return await measures.takeover(po), None  # it would claim for ever

        takeovers = await _trials(f"{short} takeover", trials, takeover_both)
        stalls = await _trials(
            f"{short} stall",
            trials,
            lambda i: measures.stalled(pools, store.stall, store.unstall, store.lease * 1.5),
        )
        splits = await _trials(f"{short} split brain", trials, lambda i: both(measures.split_brain))
        cut_off = (
            await _trials(
                f"{short} partition", trials, lambda i: both(measures.split_brain_partition)
            )
            if partitions
            else []
        )
        leader_rows = await leader_throughput(po, trials, tmp) if throughput else []

    def col(
        results: list[object], side: int, pick: Callable[[object], object] = lambda v: v
    ) -> list:
        return [pick(r[side]) for r in results]  # type: ignore[index]

    lease = f"lease {store.lease:g} s"
    no_successor = f"no successor within {store.lease * 4 + 10:g} s"
    never_release = theirs.ours is False and isinstance(theirs, OfficialOnKube)
    rows += [
        (
            f"{short}: crash failover, overshoot past the earliest take (SIGKILL at a random "
            f"moment; earliest = last write at the store + {lease})",
            Cell(col(crashes, 0, lambda v: v[0]), never=no_successor),
            Cell(col(crashes, 1, lambda v: v[0]), never=no_successor),
        ),
        (
            f"{short}: hand-off after SIGTERM (signal → successor leads)",
            Cell(col(handoffs, 0), never=no_successor),
            Cell(
                col(handoffs, 1),
                never=no_successor,
                note="(never releases: this is its failover)" if never_release else "",
            ),
        ),
        (
            f"{short}: demotion after a takeover (another identity granted at the store → old "
            "leader stops claiming)",
            Cell(col(takeovers, 0), never=f"still claiming after {3 * store.lease:g} s"),
            Cell(
                col(takeovers, 1),
                never=f"still claiming after {3 * store.lease:g} s"
                if getattr(theirs, "demotes_on_takeover", True)
                else "never looks at its key again once it has won",
            ),
        ),
        (
            f"{short}: store stalls for {1.5 * store.lease:g} s → leader stops claiming, relative "
            "to the moment another replica could be granted (negative = before)",
            Cell(col(stalls, 0), kind="signed", never="claimed through the stall"),
            Cell(col(stalls, 1), kind="signed", never="claimed through the stall"),
        ),
        (
            f"{short}: split brain after SIGSTOP of the leader for 2 leases, SIGCONT (time both "
            "claim)",
            Cell(col(splits, 0), never="nobody took over during the pause"),
            Cell(col(splits, 1), never="nobody took over during the pause"),
        ),
        *(
            [
                (
                    f"{short}: split brain after cutting the leader off the store for 2 leases "
                    "(black hole), then healing (time both claim once another leads)",
                    Cell(col(cut_off, 0), never="nobody took over during the partition"),
                    Cell(col(cut_off, 1), never="nobody took over during the partition"),
                )
            ]
            if cut_off
            else []
        ),
        (
            f"{short}: store requests/s, leader",
            Cell(col(rates, 0, lambda v: v[0]), kind="rate"),
            Cell(col(rates, 1, lambda v: v[0]), kind="rate"),
        ),
        (
            f"{short}: store requests/s, each follower",
            Cell([x for v in col(rates, 0, lambda v: v[1]) for x in v], kind="rate"),
            Cell([x for v in col(rates, 1, lambda v: v[1]) for x in v], kind="rate"),
        ),
        (
            f"{short}: RSS, leader (sampled before each crash trial's kill)",
            Cell(col(crashes, 0, lambda v: v[1]), kind="mib"),
            Cell(col(crashes, 1, lambda v: v[1]), kind="mib"),
        ),
        (
            f"{short}: RSS, each follower (same moments)",
            Cell([x for v in col(crashes, 0, lambda v: v[2]) for x in v], kind="mib"),
            Cell([x for v in col(crashes, 1, lambda v: v[2]) for x in v], kind="mib"),
        ),
        (
            f"{short}: start → leader, empty lease (spawn → its reign)",
            Cell(starts["ours"]),
            Cell(starts["theirs"]),
        ),
    ]
    if partitions:
        await store.close_proxies()
    return rows + leader_rows


# -- /leader throughput beside a bare aiohttp handler answering the same bytes ------------------


def _wrk(url: str, seconds: int) -> tuple[float, float]:
    out = subprocess.run(
        ["wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", out)
    assert rps, out
    assert p99, out
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[p99.group(2)]
    return float(rps.group(1)), float(p99.group(1)) * scale


async def leader_throughput(pool: Pool, trials: int, tmp: Path) -> list[Row]:
    if not shutil.which("wrk"):
        _log("wrk not installed: apt-get install -y wrk; /leader throughput skipped")
        return []
    _, leader = await pool.leader()
    async with aiohttp.ClientSession() as session, session.get(leader.leader_url) as response:
        body = await response.read()
        headers = [f"{k}:{response.headers[k]}" for k in ("Content-Type", "ETag", "Cache-Control")
                   if k in response.headers]  # fmt: skip
    (tmp / "body.json").write_bytes(body)
    args = ["--body-file", str(tmp / "body.json")] + [a for h in headers for a in ("--header", h)]
    bare = await asyncio.to_thread(AnchorProcess.start, "bare_leader", "bare", args)
    ours_runs, bare_runs = [], []
    try:
        for _ in range(trials):
            ours_runs.append(await asyncio.to_thread(_wrk, leader.leader_url, 2))
            bare_runs.append(await asyncio.to_thread(_wrk, bare.leader_url, 2))
    finally:
        bare.stop()
    _log(f"/leader wrk ours {ours_runs} bare {bare_runs}")
    return [
        (
            f"`/leader` throughput, `wrk -t2 -c32` 2 s runs ({len(body)}-byte body; theirs: a "
            "bare aiohttp handler answering the same bytes)",
            Cell([r for r, _ in ours_runs], kind="rps"),
            Cell([r for r, _ in bare_runs], kind="rps"),
        ),
        (
            "`/leader` latency p99 per run (same runs)",
            Cell([p for _, p in ours_runs]),
            Cell([p for _, p in bare_runs]),
        ),
    ]


async def main_async(args: argparse.Namespace) -> str:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name in args.stores.split(","):
            _log(f"store {name}")
            if name == "kubernetes":
                store: AnyStore = KubeStore(tmp)
                systems: tuple[System, System] = (OursOnKube(store), OfficialOnKube(store))
            elif name == "redis":
                store = RedisStore(tmp)
                systems = (OursOnRedis(store), RecipeOnRedis(store))
            elif name == "etcd":
                store = EtcdStore(tmp)
                systems = (OursOnEtcd(store), EtcdctlOnEtcd(store))
            elif name == "postgresql":
                store = PostgresStore(tmp)
                systems = (OursOnPostgres(store), RecipeOnPostgres(store))
            elif name == "zookeeper":
                store = ZookeeperStore(tmp)
                systems = (OursOnZookeeper(store), KazooOnZookeeper(store))
            else:
                raise SystemExit(
                    f"--stores: unknown store {name!r} "
                    "(kubernetes, redis, postgresql, etcd, zookeeper)"
                )
            try:
                rows += await bench_store(
                    store, *systems, args.trials, throughput=name == args.stores.split(",")[-1],
                    tmp=tmp,
                )  # fmt: skip
            finally:
                store.close()
    return table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stores", default="kubernetes,redis,postgresql")
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    compile_bytecode()
    began = time.monotonic()
    text = main_async_result = asyncio.run(main_async(args))
    print()
    print(text)
    print(
        f"\n{args.trials} trials per measure, {os.cpu_count()} CPUs, "
        f"{time.monotonic() - began:.0f} s; command: python -m benchmarks.run "
        f"--stores {args.stores} --trials {args.trials}"
    )
    del main_async_result


if __name__ == "__main__":
    main()
