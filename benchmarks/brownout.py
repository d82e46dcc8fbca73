"""Brownouts of the Kubernetes API server: what each sidecar asks of an API server that is
already failing, and how soon every lease is led again once it is back — our sidecar beside the
official client's elector (`benchmarks/anchors/k8s_elector.py`), in the same run, on one fake
API server (`tests/fakekube`, its own process). Run on purpose, never in CI:

    nice python -m benchmarks.brownout                          # 30 sidecars, ~15 minutes
    python -m benchmarks.brownout --sidecars 12 --seconds 30 --health 30   # a smoke run

The cluster: ``--sidecars`` of ours, half of them apps of 3 replicas sharing one lease, the
rest apps of 3 replicas sharing 16 shards (``--lease jobsK --shards 16``); ``--official``
anchors, half on one lease (3 replicas), half on 16 leases each (3 replicas, one
``LeaderElection`` per lease in each process: that client knows no shards). Default timing for
both: lease 15 s, retry period 2 s (ours renews every 5 s, the official leader every retry
period, client-go's defaults).

Every process reaches the API server through its own `counting_proxy.CountingProxy`, which
counts its requests by kind (list, watch, get, write = create/update/patch/delete) — also those
the server never answers.

Each brownout lasts ``--seconds`` (default 120: a first minute, then the minute measured), then
``--health`` seconds of health (default 60):

* API down: every open connection reset, and every new one as soon as its request is in;
* every request answered 429 with ``Retry-After: 5`` (as API Priority and Fairness does);
* every watch answered an empty 200 at once (a proxy that closes long streams);
* every request answered 500.

Per brownout and kind of process: requests/s per process after the brownout's first minute
(total as median / max over the processes, and the median per kind), and the time from
recovery until every lease of that kind is led again: the first successful write to each lease
after recovery, in the fake's request log (a lease written successfully within its last lease
duration before recovery was led throughout). Targets, ours: at most one request per retry
period plus one per 30 s per watch loop (two: the lease or namespace watch, the candidates) —
for the ended watches, lists and watches alone (the rest is the healthy renewals); every lease
led again within one lease + 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.counting_proxy import KINDS, CountingProxy
from benchmarks.processes import AnchorProcess, compile_bytecode
from tests.fakekube import FakeKubeProcess, write_kubeconfig
from tests.support.sidecars import SidecarProcess

NAMESPACE = "demo"
LEASE = 15.0
RETRY = 2.0
WATCH_LOOPS = 2
SHARDS = 16
REPLICAS = 3  # per app
TARGET_RATE = 1 / RETRY + WATCH_LOOPS / 30
TARGET_RECOVERY = LEASE + 30
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


@dataclasses.dataclass(frozen=True)
class Brownout:
    name: str
    faults: dict[str, Any] | None = None  # the fake's faults; None: the proxies go down
    watches_only: bool = False  # the target counts lists and watches only


BROWNOUTS = (
    Brownout("API down (every connection reset)"),
    Brownout("every request 429, Retry-After: 5", {"errors": [{"status": 429, "retry_after": 5}]}),
    Brownout("every watch ended at once (empty 200)", {"end_watches": True}, watches_only=True),
    Brownout("every request 500", {"errors": [{"status": 500}]}),
)


@dataclasses.dataclass
class Member:
    """One process: which system, its layout, its leases, its proxy."""

    system: str  # "ours" | "official"
    layout: str  # "1 lease" | "16 leases"
    leases: tuple[str, ...]
    proxy: CountingProxy
    process: SidecarProcess | AnchorProcess | None = None

    @property
    def group(self) -> tuple[str, str]:
        return self.system, self.layout


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def plan(sidecars: int, official: int) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(system, layout, app, leases) per process."""
    members = []
    for system, count in (("ours", sidecars), ("official", official)):
        single = count // 2
        for i in range(count):
            app_index = (i if i < single else i - single) // REPLICAS
            if i < single:
                app = f"{system}-app{app_index}"
                members.append((system, "1 lease", app, (app,)))
            else:
                app = f"{system}-jobs{app_index}"
                shards = tuple(f"{app}-{k}" for k in range(SHARDS))
                members.append((system, f"{SHARDS} leases", app, shards))
    return members


def start_member(member: Member, app: str, slot: int, fake: FakeKubeProcess, tmp: Path) -> None:
    kubeconfig = write_kubeconfig(tmp / f"kubeconfig-{slot}", member.proxy.url, NAMESPACE)
    name = f"{member.system}-{slot}"
    if member.system == "ours":
        fake.create_pod(NAMESPACE, name)
        shards = ["--shards", str(SHARDS)] if len(member.leases) > 1 else []
        member.process = SidecarProcess.start(
            name,
            "kubernetes",
            lease_duration=f"{LEASE:g}s",
            args=["--lease", app, *shards, "--namespace", NAMESPACE, "--kubeconfig",
                  str(kubeconfig), "--pod-name", name, "--log-level", "info"],
        )  # fmt: skip
        return
    member.process = AnchorProcess.start(
        "k8s_elector",
        name,
        ["--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--lease",
         ",".join(member.leases), "--lease-duration", f"{LEASE:.0f}", "--renew-deadline", "10",
         "--retry-period", f"{RETRY:.0f}"],
    )  # fmt: skip


def create_empty_lease(fake: FakeKubeProcess, name: str) -> None:
    """The official elector needs its Lease to exist (its own create fails)."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"leaseDurationSeconds": int(LEASE)},
    }
    status, answer = fake.request("POST", LEASES, body)
    if status not in (201, 409):
        raise RuntimeError(f"create lease {name}: {status} {answer}")


def holders(fake: FakeKubeProcess) -> dict[str, str]:
    status, body = fake.request("GET", LEASES)
    assert status == 200, body
    return {
        item["metadata"]["name"]: (item.get("spec") or {}).get("holderIdentity") or ""
        for item in body["items"]
    }


async def all_led(fake: FakeKubeProcess, leases: set[str], timeout: float) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        held = holders(fake)
        if all(held.get(name) for name in leases):
            return time.monotonic() - began
        await asyncio.sleep(0.5)
    return None


def recovery(log: list[dict[str, Any]], leases: tuple[str, ...], back: float) -> float | str:
    """Seconds from ``back`` until every lease had a successful write (leases written within
    the lease before ``back`` were led throughout); "not led" when one never was."""
    writes: dict[str, list[float]] = {}
    for entry in log:
        if (
            entry["resource"] == "leases"
            and entry["verb"] in ("create", "update", "patch")
            and entry["status"] in (200, 201)
        ):
            writes.setdefault(entry["name"], []).append(entry["t"])
    waits = []
    for lease in leases:
        times = writes.get(lease, [])
        if any(back - LEASE <= t < back for t in times):
            waits.append(0.0)
            continue
        after = [t - back for t in times if t >= back]
        if not after:
            return "not led"
        waits.append(min(after))
    return max(waits, default=0.0)


@dataclasses.dataclass
class Result:
    brownout: str
    group: tuple[str, str]
    processes: int
    totals: list[float]
    kinds: dict[str, float]  # median per kind
    watch_loops: list[float]  # lists + watches per process
    resent: float  # aiohttp's resends of refused requests, per process per second (median)
    recovered: float | str
    watches_only: bool

    def row(self) -> str:
        system, layout = self.group
        total = f"{statistics.median(self.totals):.2f} / {max(self.totals):.2f}"
        kinds = " | ".join(f"{self.kinds[k]:.2f}" for k in ("list", "watch", "get", "write"))
        recovered = (
            self.recovered
            if isinstance(self.recovered, str)
            else ("led throughout" if self.recovered == 0 else f"{self.recovered:.1f} s")
        )
        verdict = ""
        if system == "ours" and self.brownout != HEALTHY:
            measured = max(self.watch_loops) if self.watches_only else max(self.totals)
            bound = WATCH_LOOPS / 30 if self.watches_only else TARGET_RATE
            rate_ok = measured <= bound + 1e-9
            back_ok = not isinstance(self.recovered, str) and self.recovered <= TARGET_RECOVERY
            what = "lists+watches" if self.watches_only else "total"
            verdict = (
                f"{what} ≤ {bound:.2f}/s: {'met' if rate_ok else 'MISSED'}; "
                f"led ≤ {TARGET_RECOVERY:.0f} s: {'met' if back_ok else 'MISSED'}"
            )
        return (
            f"| {self.brownout} | {system}, {layout} ({self.processes}) | {total} | {kinds} "
            f"| {recovered} | {verdict} |"
        )


HEALTHY = "healthy (before the first)"

HEADER = (
    "| brownout | processes (count) | requests/s per process after the first minute: total, "
    "median / max | list | watch | get | write | recovery → every lease led | target (ours) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def rates(
    members: list[Member], since: float, until: float
) -> dict[tuple[str, str], list[dict[str, float]]]:
    span = until - since
    grouped: dict[tuple[str, str], list[dict[str, float]]] = {}
    for member in members:
        counts = member.proxy.counted(since, until)
        grouped.setdefault(member.group, []).append({k: v / span for k, v in counts.items()})
    return grouped


def summarize(
    name: str,
    members: list[Member],
    since: float,
    until: float,
    recovered: dict[tuple[str, str], float | str],
    watches_only: bool,
) -> list[Result]:
    results = []
    for group, per_process in rates(members, since, until).items():
        results.append(
            Result(
                brownout=name,
                group=group,
                processes=len(per_process),
                totals=[r["total"] for r in per_process],
                kinds={k: statistics.median(r[k] for r in per_process) for k in KINDS},
                watch_loops=[r["list"] + r["watch"] for r in per_process],
                resent=statistics.median(r["resent"] for r in per_process),
                recovered=recovered.get(group, "—"),
                watches_only=watches_only,
            )
        )
    return results


async def run(args: argparse.Namespace, tmp: Path) -> list[Result]:
    fake = FakeKubeProcess.start()
    upstream = ("127.0.0.1", int(fake.url.rsplit(":", 1)[1]))
    members: list[Member] = []
    try:
        layout = plan(args.sidecars, args.official)
        for system, _, _, leases in layout:
            if system == "official":
                for lease in leases:
                    create_empty_lease(fake, lease)
        for slot, (system, kind, app, leases) in enumerate(layout):
            member = Member(system, kind, leases, CountingProxy(f"{system}-{slot}", upstream))
            await member.proxy.start()
            members.append(member)
            await asyncio.to_thread(start_member, member, app, slot, fake, tmp)
        _log(f"started {len(members)} processes")
        every_lease = {lease for member in members for lease in member.leases}
        took = await all_led(fake, every_lease, 180)
        if took is None:
            raise RuntimeError("not every lease was led within 180 s of the start")
        _log(f"every lease led ({len(every_lease)})")
        results: list[Result] = []
        began = time.monotonic()
        await asyncio.sleep(args.health)
        results += summarize(HEALTHY, members, began, time.monotonic(), {}, False)
        for brownout in BROWNOUTS:
            if args.only in brownout.name:
                results += await one_brownout(brownout, fake, members, args)
        return results
    finally:
        for member in members:
            if member.process is not None:
                member.process.stop()
            await member.proxy.close()
        fake.stop()


async def one_brownout(
    brownout: Brownout, fake: FakeKubeProcess, members: list[Member], args: argparse.Namespace
) -> list[Result]:
    fake.clear_requests()
    _log(f"brownout: {brownout.name}")
    start = time.monotonic()
    if brownout.faults is None:
        for member in members:
            member.proxy.go_down()
    else:
        fake.set_faults(**brownout.faults)
    await asyncio.sleep(args.seconds)
    back = time.monotonic()
    log = fake.requests()
    fake.clear_requests()
    if brownout.faults is None:
        for member in members:
            member.proxy.come_back()
    else:
        fake.clear_faults()
    _log("healthy again")
    await asyncio.sleep(args.health)
    log += fake.requests()
    groups: dict[tuple[str, str], tuple[str, ...]] = {}
    for member in members:
        groups[member.group] = tuple(sorted({*groups.get(member.group, ()), *member.leases}))
    recovered = {group: recovery(log, leases, back) for group, leases in groups.items()}
    _log(f"recovered: {recovered}")
    every_lease = {lease for member in members for lease in member.leases}
    if await all_led(fake, every_lease, 120) is None:
        _log("WARNING: not every lease led 120 s after the health period")
    warmup = min(60.0, args.seconds / 2)
    return summarize(brownout.name, members, start + warmup, back, recovered, brownout.watches_only)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sidecars", type=int, default=30, help="our sidecars (default 30)")
    parser.add_argument("--official", type=int, default=6, help="official electors (default 6)")
    parser.add_argument("--seconds", type=float, default=120.0, help="each brownout's length")
    parser.add_argument("--health", type=float, default=60.0, help="health after each")
    parser.add_argument("--only", default="", help="only the brownouts whose name has this")
    args = parser.parse_args()
    compile_bytecode()
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    warmup = min(60.0, args.seconds / 2)
    print()
    print(HEADER)
    for result in results:
        print(result.row())
    resent = [f"{r.group[0]}, {r.group[1]}: {r.resent:.2f}/s" for r in results if r.resent > 0]
    if resent:
        print(
            "\nNot counted above: aiohttp's own resend of an idempotent request whose "
            "connection was reset (API down), per process: " + "; ".join(resent)
        )
    print(
        f"\n{args.sidecars} sidecars of ours and {args.official} official electors on one fake "
        f"API server; each brownout {args.seconds:g} s (measured after its first "
        f"{warmup:g} s), then {args.health:g} s of health; lease {LEASE:g} s, retry period "
        f"{RETRY:g} s; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"{time.monotonic() - began:.0f} s; command: python -m benchmarks.brownout "
        f"--sidecars {args.sidecars} --official {args.official} --seconds {args.seconds:g} "
        f"--health {args.health:g}" + (f" --only {args.only!r}" if args.only else "")
    )


if __name__ == "__main__":
    main()
