"""Where a hand-off's milliseconds go, step by step, from stamps inside the processes.

    python -m benchmarks.handoff_steps --stores postgresql,etcd,zookeeper --trials 20

The trial is `measures.handoff`'s (SIGTERM of the leader of three once the pool is quiet, until
the successor leads; the signalled replica replaced), on `benchmarks.handoffs`' stores. The
sidecar must print the step stamps, one JSON line on stderr each, ``{"trace": STEP, "at":
time.time(), ...}``: they are not in the sidecar, but in `benchmarks/handoff_stamps.patch`
(``git apply benchmarks/handoff_stamps.patch`` before the run, ``git apply -R`` after; a
profile's temporary change, never committed to the sidecar). The steps:

- the leader's: ``signal`` (the handler), ``shutdown`` (`LeaseSet.shutdown` begins),
  ``candidates_read`` / ``candidates_read_done`` (the read before choosing, when it is done),
  ``chosen``, ``demoted`` (`release._release_locked` after `demote`), ``request`` (before the
  hand-over's `Elector.request`), ``swap_sent`` (etcd, ZooKeeper: just before the swap goes
  out), ``answered``;
- the successor's: ``notified_raw`` (etcd: a watch line read, before it is parsed),
  ``notified`` (the lease's notification: PostgreSQL's listener callback, etcd's event
  decoded, ZooKeeper's watch event), ``read_sent`` / ``read_answered`` (ZooKeeper: the read
  the event triggers), ``on_watch`` (`Elector.on_watch`), ``leads`` (`become_leader`);
- every process: ``call`` with ``op`` and ``took`` at the end of each `store_call`, whose
  renewals (one write with our client) give each store's round trip in the same run.

Prints per step the median, slowest and fastest, and the renewals' round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import measures
from benchmarks.handoffs import STORES
from benchmarks.measures import Pool
from benchmarks.processes import compile_bytecode

LEADER = ["sent", "signal", "shutdown", "candidates_read", "candidates_read_done", "chosen",
          "demoted", "request", "swap_sent", "answered"]  # fmt: skip
SUCCESSOR = ["request", "notified_raw", "notified", "read_sent", "read_answered", "on_watch",
             "leads"]  # fmt: skip


def _stamps(replica: Any, since: float) -> list[dict[str, Any]]:
    return [e for e in list(replica.logs) if "trace" in e and e["at"] >= since]


def _first(stamps: list[dict[str, Any]], step: str, after: float) -> float | None:
    return next((float(e["at"]) for e in stamps if e["trace"] == step and e["at"] >= after), None)


def steps_of(began: float, leader: Any, successor: Any) -> dict[str, float] | None:
    """One trial's moments by step (wall clock), or None where a step is missing."""
    ours, theirs = _stamps(leader, began), _stamps(successor, began)
    at: dict[str, float] = {"sent": began}
    previous = began
    for step in ("signal", "shutdown", "chosen", "demoted", "request", "answered"):
        moment = _first(ours, step, previous)
        if moment is None:
            return None
        at[step] = previous = moment
    read = _first(ours, "candidates_read", began)
    if read is not None and read <= at["chosen"]:
        at["candidates_read"] = read
        at["candidates_read_done"] = _first(ours, "candidates_read_done", read) or read
    swap = _first(ours, "swap_sent", at["request"])
    if swap is not None and swap <= at["answered"]:
        at["swap_sent"] = swap
    notified = _first(theirs, "notified", at["request"])
    leads = _first(theirs, "leads", at["request"])
    if notified is None or leads is None:
        return None
    at["notified"], at["leads"] = notified, leads
    raw = _first(theirs, "notified_raw", at["request"])
    if raw is not None and raw <= notified:
        at["notified_raw"] = raw
    read_sent = _first(theirs, "read_sent", notified)
    if read_sent is not None and read_sent < leads:
        at["read_sent"] = read_sent
        at["read_answered"] = _first(theirs, "read_answered", read_sent) or read_sent
    on_watch = _first(theirs, "on_watch", at.get("read_answered", notified))
    if on_watch is not None and on_watch <= leads:
        at["on_watch"] = on_watch
    return at


async def one_trial(pool: Pool) -> dict[str, float] | None:
    first, leader = await pool.settle()
    await measures.quiet([pool])
    began = time.time()
    leader.signal(signal.SIGTERM)
    try:
        sample = await pool.observer.wait_for(
            lambda s: s.leader and s.name != first.name and s.sent >= began,
            timeout=measures.successor_timeout(pool),
        )
    except AssertionError:
        await pool.replace(leader)
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(leader.proc.wait, 10)
    await asyncio.sleep(0.05)  # the stderr readers catch up
    at = steps_of(began, leader, pool.by_name(sample.name))
    await pool.replace(leader)
    return at


async def one_store(name: str, trials: int, tmp: Path, proxies: bool) -> dict[str, Any]:
    store_class, ours_class = STORES[name]
    (tmp / name).mkdir()
    store = store_class(tmp / name)  # type: ignore[abstract]
    if proxies and name == "zookeeper":
        store.proxies = True  # type: ignore[attr-defined]  # through the harness's frame proxies
    everyone: list[Any] = []
    loads = [os.getloadavg()[0]]
    began = time.time()
    try:
        system = ours_class(store)  # type: ignore[arg-type]
        async with Pool(system) as pool:
            spawn = pool._spawn

            async def spawn_kept(slot: str) -> Any:
                replica = await spawn(slot)
                everyone.append(replica)
                return replica

            pool._spawn = spawn_kept  # type: ignore[method-assign]
            everyone.extend(pool.replicas)
            results = []
            for _ in range(trials):
                results.append(await one_trial(pool))
                loads.append(os.getloadavg()[0])
    finally:
        store.close()
    renewals = [
        float(e["took"])
        for replica in everyone
        for e in list(replica.logs)
        if e.get("trace") == "call" and e.get("op") == "renew" and e.get("outcome") == "ok"
        and e["at"] >= began
    ]  # fmt: skip
    return {"trials": results, "renewals": renewals, "loads": loads}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def report(name: str, data: dict[str, Any]) -> str:
    done = [t for t in data["trials"] if t is not None]
    lines = [
        f"## {name}: {len(done)} of {len(data['trials'])} trials traced, load (1 min) "
        f"{min(data['loads']):.1f} to {max(data['loads']):.1f}"
    ]
    gaps: dict[str, list[float]] = {}
    for t in done:
        for order in (LEADER, SUCCESSOR):
            present = [s for s in order if s in t]
            for a, b in itertools.pairwise(present):
                gaps.setdefault(f"{a} → {b}", []).append(t[b] - t[a])
        gaps.setdefault("total: sent → leads", []).append(t["leads"] - t["sent"])
    for label, values in gaps.items():
        lines.append(
            f"{label:<42} n={len(values):2}  median {_ms(statistics.median(values))}  "
            f"slowest {_ms(max(values))}  fastest {_ms(min(values))}"
        )
    renewals = data["renewals"]
    if renewals:
        lines.append(
            f"renewal round trip (one write, our client): n={len(renewals)}  median "
            f"{_ms(statistics.median(renewals))}  slowest {_ms(max(renewals))}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        for name in args.stores.split(","):
            if name not in STORES:
                raise SystemExit(f"--stores: unknown store {name!r} ({', '.join(STORES)})")
            out[name] = await one_store(name, args.trials, Path(tmp_name), args.zookeeper_proxies)
            print(report(name, out[name]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stores", default="postgresql,etcd,zookeeper")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--json", default="", help="also write every trial's stamps here")
    parser.add_argument(
        "--zookeeper-proxies",
        action="store_true",
        help="ZooKeeper's replicas connect through the frame proxies, as in benchmarks.run",
    )
    args = parser.parse_args()
    compile_bytecode()
    out = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
