"""Where a hand-off's milliseconds go, step by step, from stamps inside the processes.

    python -m benchmarks.handoff_steps --stores postgresql,etcd,zookeeper --trials 20
    python -m benchmarks.handoff_steps --stores kubernetes,sqlite --trials 20

The trial is `measures.handoff`'s (SIGTERM of the leader of three once the pool is quiet, until
the successor leads; the signalled replica replaced), on `benchmarks.handoffs`' stores. The
sidecar must print the step stamps, one JSON line on stderr each, ``{"trace": STEP, "at":
time.time(), ...}``: they are not in the sidecar, but in `benchmarks/handoff_stamps.patch`
(``git apply benchmarks/handoff_stamps.patch`` before the run, ``git apply -R`` after; a
profile's temporary change, never committed to the sidecar). The steps:

- the harness's: ``sent`` (before its ``kill``), ``killed`` (when the ``kill`` returned);
- the leader's: ``signal`` (the handler), ``shutdown`` (`LeaseSet.shutdown` begins),
  ``candidates_read`` / ``candidates_read_done`` (the read before choosing, when it is done),
  ``chosen``, ``demoted`` (`release._release_locked` after `demote`), ``request`` (before the
  hand-over's `Elector.request`), ``swap_sent`` (etcd, ZooKeeper, Kubernetes, SQLite: just
  before the hand-over's write goes out), on SQLite the write on the connection's thread
  (``job_started``, ``locked`` after ``BEGIN IMMEDIATE``, ``commit_sent`` before ``COMMIT``,
  ``committed``) and the wake-up datagrams after it (``wake_begin``, ``wake_sent`` once every
  peer's is sent), ``answered``;
- the fake API server's (Kubernetes; its output, not a sidecar's): ``server_in`` (the
  hand-over's PATCH handled from), ``server_done`` (its answer made), ``server_event`` (each
  watch's event line, before it is written: the first, and the last before the successor
  read its own);
- the successor's: ``woken`` (SQLite: a wake-up datagram read), ``notified_raw`` (etcd,
  Kubernetes: a watch line read, before it is parsed), ``look_sent`` / ``look_started``
  (SQLite: the look submitted, begun on the connection's thread), ``notified`` (the lease's
  notification: PostgreSQL's listener callback, etcd's and Kubernetes' event decoded,
  ZooKeeper's watch event, SQLite's look back with changed rows), ``read_sent`` /
  ``read_answered`` (ZooKeeper: the read the event triggers), ``on_watch``
  (`Elector.on_watch`), ``leads`` (`become_leader`);
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

LEADER = ["sent", "killed", "signal", "shutdown", "candidates_read", "candidates_read_done",
          "chosen", "demoted", "request", "swap_sent", "server_in", "server_done", "job_started",
          "locked", "commit_sent", "committed", "answered"]  # fmt: skip
SUCCESSOR = ["request", "server_in", "server_event", "server_event_last", "committed",
             "wake_begin", "woken", "notified_raw", "look_sent", "look_started", "notified",
             "read_sent", "read_answered", "on_watch", "leads"]  # fmt: skip
WRITE = ["job_started", "locked", "commit_sent", "committed"]  # SQLite's, on its thread
ASIDE = [("wake_begin", "wake_sent")]  # SQLite: the datagrams to every peer (the first wakes)


def _stamps(replica: Any, since: float) -> list[dict[str, Any]]:
    return [e for e in list(replica.logs) if "trace" in e and e["at"] >= since]


def _first(stamps: list[dict[str, Any]], step: str, after: float) -> float | None:
    return next((float(e["at"]) for e in stamps if e["trace"] == step and e["at"] >= after), None)


def _last(stamps: list[dict[str, Any]], step: str, after: float, before: float) -> float | None:
    moments = [float(e["at"]) for e in stamps if e["trace"] == step and after <= e["at"] <= before]
    return max(moments, default=None)


def server_stamps(lines: list[str], since: float) -> list[dict[str, Any]]:
    """The fake API server's stamps (its output lines), when it is the store."""
    stamps = []
    for line in list(lines):
        if line.startswith('{"trace"'):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry["at"] >= since:
                    stamps.append(entry)
    return stamps


def steps_of(
    began: float,
    leader: Any,
    successor: Any,
    server: list[dict[str, Any]] | None = None,
    killed: float | None = None,
) -> dict[str, float] | None:
    """One trial's moments by step (wall clock), or None where a step is missing. ``killed``:
    when the harness's ``kill`` returned (``sent`` is just before it)."""
    ours, theirs = _stamps(leader, began), _stamps(successor, began)
    at: dict[str, float] = {"sent": began}
    if killed is not None:
        at["killed"] = killed
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
    previous = at.get("swap_sent", at["request"])
    for step in WRITE:  # the leader's write on its connection's thread, in order
        moment = _first(ours, step, previous)
        if moment is None or moment > at["answered"]:
            break
        at[step] = previous = moment
    notified = _first(theirs, "notified", at["request"])
    leads = _first(theirs, "leads", at["request"])
    if notified is None or leads is None:
        return None
    at["notified"], at["leads"] = notified, leads
    if server:  # the fake API server: the hand-over's write arriving, answered, its event out
        arrived = _first(server, "server_in", at.get("swap_sent", at["request"]))
        if arrived is not None and arrived <= notified:
            at["server_in"] = arrived
            done = _first(server, "server_done", arrived)
            if done is not None and done <= at["answered"]:
                at["server_done"] = done
            event = _first(server, "server_event", arrived)
            if event is not None and event <= notified:
                at["server_event"] = event
                # one event line per watch of the lease; the successor's is one of them
                raw = _last(theirs, "notified_raw", event, notified) or notified
                last = _last(server, "server_event", event, raw)
                if last is not None and last > event:
                    at["server_event_last"] = last
    if "committed" in at:  # SQLite: the wake-up datagrams, sent after the commit
        begin = _first(ours, "wake_begin", at["committed"])
        wake = _first(ours, "wake_sent", begin or at["committed"])
        if begin is not None and begin <= notified:
            at["wake_begin"] = begin
            if wake is not None:  # (after the first peer's: the successor may be woken first)
                at["wake_sent"] = wake
    # The successor's own steps before its notification: the last of each before it.
    floor = at["request"]
    for step in ("woken", "notified_raw", "look_sent", "look_started"):
        moment = _last(theirs, step, floor, notified)
        if moment is not None:
            at[step] = floor = moment
    read_sent = _first(theirs, "read_sent", notified)
    if read_sent is not None and read_sent < leads:
        at["read_sent"] = read_sent
        at["read_answered"] = _first(theirs, "read_answered", read_sent) or read_sent
    on_watch = _first(theirs, "on_watch", at.get("read_answered", notified))
    if on_watch is not None and on_watch <= leads:
        at["on_watch"] = on_watch
    return at


async def one_trial(pool: Pool, server_lines: list[str] | None = None) -> dict[str, float] | None:
    first, leader = await pool.settle()
    await measures.quiet([pool])
    began = time.time()
    leader.signal(signal.SIGTERM)
    killed = time.time()
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
    server = server_stamps(server_lines, began) if server_lines is not None else None
    at = steps_of(began, leader, pool.by_name(sample.name), server, killed)
    await pool.replace(leader)
    return at


async def one_store(name: str, trials: int, tmp: Path, proxies: bool) -> dict[str, Any]:
    store_class, ours_class = STORES[name]
    (tmp / name).mkdir()
    store = store_class(tmp / name)  # type: ignore[abstract]
    if proxies and name == "zookeeper":
        store.proxies = True  # type: ignore[attr-defined]  # through the harness's frame proxies
    everyone: list[Any] = []
    fake = getattr(store, "fake", None)  # the fake API server's output, where it is the store
    server_lines: list[str] | None = getattr(fake, "log", None)
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
                results.append(await one_trial(pool, server_lines))
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
        for a, b in ASIDE:
            if a in t and b in t:
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
