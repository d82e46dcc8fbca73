"""Many leases per sidecar: what 10, 100 and 1000 leases cost one replica, and whether they
stay led.

    python -m benchmarks.many_leases                                  # SQLite, 1 and 3 replicas
    python -m benchmarks.many_leases --stores sqlite,redis --leases 10,100 --window 20
    python -m benchmarks.many_leases --leases 1000 --replicas 3 --metrics-per-lease  # both shapes
    python -m benchmarks.many_leases --stores sqlite,redis --leases 1000 --replicas 3 --runs 10
    python -m benchmarks.many_leases --stores kubernetes --leases 100,1000 --replicas 3
    python -m benchmarks.many_leases --stores zookeeper,redis --leases 1000 --replicas 3

Each case starts ``--replicas`` real ``python -m sidecar`` processes at once (as a Deployment
does) with ``--lease l --shards N`` and the default timing (lease 15 s, renew every 5 s;
``--lease-duration`` sets another lease), on a fresh store (one SQLite file; one
``redis-server``; one standalone ZooKeeper server of ``tests/zookeeper/servers.py``; or the
fake Kubernetes API server of ``tests/fakekube`` in its own process, a pod per replica).
``--runs`` repeats each case, each run on a fresh store, and ends with how
many runs reached all led and balanced without a lease lost (no ``deadline`` or ``lost``
demotion, no renewal-gap alert). Measured per replica:

- **all led**: spawn of the first process → every lease led by some replica (each replica's
  ``GET /leases`` every 0.25 s, every ``N / 2000`` s beyond 500 leases); with several
  replicas also → balanced (nobody above its share, ceil(N / replicas)).
- then, after 5 s more, a window of ``--window`` seconds: **store requests/s** (the rise of
  the sidecar's own ``leader_sidecar_store_requests_total``, every label summed, over the
  window, each scrape timed at its middle), **CPU %** of one core (``utime + stime`` from
  ``/proc/<pid>/stat``), **RSS** (``VmRSS`` at the end), and what one scrape of its
  ``/metrics`` costs Prometheus at the end: **series** (samples in the exposition) and **KB**;
  on ZooKeeper also the packets the server received per second in the window from all the
  replicas (``mntr``), printed with the operations: the followers' reads and the pings;
- **health** over the whole run: ``leader_sidecar_demotions_total`` by reason (``released``
  is the balancer handing leases to a replica that joined; anything else is a lease lost),
  ``leader_sidecar_renewal_gap_over_half_lease_total``, and any ``/leases`` poll during the
  window (every 5 s) in which some lease had no leader.

``--metrics-per-lease`` runs every case a second time with ``--metrics-per-lease true`` (every
metric labelled by lease, what all sidecars exported before lease groups) beside the default,
for the scrape's series and KB side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.processes import rss_mib
from tests.support.sidecars import SidecarProcess

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    # the fields after the command name (which may hold spaces) start at field 3
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


@dataclasses.dataclass
class Case:
    store: str
    leases: int
    replicas: int
    per_lease: bool = False  # --metrics-per-lease true
    all_led: float | None = None
    balanced: float | None = None
    requests: list[float] = dataclasses.field(default_factory=list)  # per replica, per second
    by_op: Counter[str] = dataclasses.field(default_factory=Counter)  # summed over replicas
    cpu: list[float] = dataclasses.field(default_factory=list)  # % of one core
    rss: list[float] = dataclasses.field(default_factory=list)
    held: list[int] = dataclasses.field(default_factory=list)
    series: list[int] = dataclasses.field(default_factory=list)  # per scrape of /metrics
    scrape_kb: list[float] = dataclasses.field(default_factory=list)
    demotions: Counter[str] = dataclasses.field(default_factory=Counter)
    gap_alerts: float = 0
    gap_alerts_window: float = 0
    unled_polls: int = 0
    polls: int = 0
    # ZooKeeper: packets the server received per second in the window, from every replica
    # (its ``mntr``): the follower reads and pings the sidecars' own counter leaves out.
    server_packets: float | None = None
    min_led: int | None = None
    failed: str = ""


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    try:
        async with session.get(url) as response:
            return response.status, await response.text()
    except (TimeoutError, aiohttp.ClientError):
        return 0, ""


async def metrics(
    session: aiohttp.ClientSession, replica: SidecarProcess
) -> tuple[float, dict[str, Counter]]:
    """(when: the middle of the scrape, which takes a while with 1000 leases; family →
    (label summary → value), counters only, summed over leases)."""
    sent = time.monotonic()
    _, text = await _get(session, f"http://{replica.public}/metrics")
    when = (sent + time.monotonic()) / 2
    out: dict[str, Counter[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            label = sample.labels.get("reason") or sample.labels.get("op", "")
            if "outcome" in sample.labels:
                label += ":" + sample.labels["outcome"]
            out.setdefault(sample.name, Counter())[label] += sample.value
    return when, out


async def scrape_size(session: aiohttp.ClientSession, replica: SidecarProcess) -> tuple[int, int]:
    """(series, bytes) of one scrape of the replica's /metrics."""
    _, text = await _get(session, f"http://{replica.public}/metrics")
    series = sum(len(family.samples) for family in text_string_to_metric_families(text))
    return series, len(text.encode())


async def held(session: aiohttp.ClientSession, replicas: list[SidecarProcess]) -> list[set[str]]:

    result = []
    for replica in replicas:
        status, text = await _get(session, f"http://{replica.local}/leases")
        body = json.loads(text) if status == 200 else {"leases": []}
        result.append({e["lease"] for e in body["leases"] if e["leader"]})
    return result


@contextlib.contextmanager
def store_url(kind: str, workdir: Path, replicas: int) -> Iterator[tuple[str, list[list[str]]]]:
    """The ``--store`` every replica is given, and each replica's own further arguments."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir}/leases.db", [[] for _ in range(replicas)]
        return
    if kind == "kubernetes":
        from tests.fakekube.process import FakeKubeProcess

        fake = FakeKubeProcess.start()
        try:
            kubeconfig = fake.kubeconfig(workdir / "kubeconfig", "demo")
            for i in range(replicas):
                fake.create_pod("demo", f"r{i}")
            yield (
                "kubernetes",
                [
                    ["--kubeconfig", str(kubeconfig), "--namespace", "demo", "--pod-name", f"r{i}"]
                    for i in range(replicas)
                ],
            )
        finally:
            fake.stop()
        return
    if kind == "zookeeper":
        from tests.zookeeper.servers import Standalone

        zookeeper = Standalone.start(workdir)
        try:
            yield zookeeper.url("/many-leases"), [[] for _ in range(replicas)]
        finally:
            zookeeper.kill()
        return
    from tests.redis.servers import RedisServer

    server = RedisServer.start(workdir)
    try:
        yield server.url, [[] for _ in range(replicas)]
    finally:
        server.stop()


def server_packets(store: str, url: str) -> int | None:
    """The packets a ZooKeeper server has received so far (``mntr``); None for other stores."""
    if store != "zookeeper":
        return None
    from tests.zookeeper.servers import four_letter

    port = int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    for line in four_letter(port, "mntr").splitlines():
        name, _, value = line.partition("\t")
        if name == "zk_packets_received":
            return int(value)
    return None


async def run_case(
    case: Case, window: float, settle: float = 120.0, lease_duration: str = "15s"
) -> Case:
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    replicas: list[SidecarProcess] = []
    with (
        tempfile.TemporaryDirectory(prefix="many-leases-") as tmp,
        store_url(case.store, Path(tmp), case.replicas) as (url, own),
    ):
        try:
            args = ["--lease", "l", "--shards", str(case.leases), "--log-level", "info"]
            if case.per_lease:
                args += ["--metrics-per-lease", "true"]
            began = time.monotonic()
            try:
                replicas = list(
                    await asyncio.gather(
                        *(
                            asyncio.to_thread(
                                SidecarProcess.start,
                                f"r{i}",
                                url,
                                lease_duration=lease_duration,
                                args=[*args, *own[i]],
                                ready_timeout=60.0,
                            )
                            for i in range(case.replicas)
                        )
                    )
                )
            except AssertionError as exc:
                case.failed = str(exc).splitlines()[-1][:200]
                return case
            share = math.ceil(case.leases / case.replicas)
            while time.monotonic() - began < settle:
                sets = await held(session, replicas)
                led = set().union(*sets)
                if case.all_led is None and len(led) == case.leases:
                    case.all_led = time.monotonic() - began
                if case.all_led is not None and all(len(s) <= share for s in sets):
                    case.balanced = time.monotonic() - began
                    break
                # Each poll is every lease of every replica: at 10,000 leases a 2 MB answer
                # that costs the replica more than its leases do; poll those less often.
                await asyncio.sleep(max(0.25, case.leases / 2000))
            await asyncio.sleep(5)
            before = [await metrics(session, r) for r in replicas]
            packets0 = (time.monotonic(), server_packets(case.store, url))
            cpu0 = [cpu_seconds(r.proc.pid) for r in replicas]
            t0 = time.monotonic()
            end = t0 + window
            while time.monotonic() < end:
                await asyncio.sleep(min(5.0, max(0.0, end - time.monotonic())))
                sets = await held(session, replicas)
                led = len(set().union(*sets))
                case.polls += 1
                case.unled_polls += led < case.leases
                case.min_led = led if case.min_led is None else min(case.min_led, led)
            cpu1 = [cpu_seconds(r.proc.pid) for r in replicas]
            packets1 = (time.monotonic(), server_packets(case.store, url))
            if packets0[1] is not None and packets1[1] is not None:
                case.server_packets = (packets1[1] - packets0[1]) / (packets1[0] - packets0[0])
            elapsed = time.monotonic() - t0
            after = [await metrics(session, r) for r in replicas]
            name = "leader_sidecar_store_requests_total"
            gap = "leader_sidecar_renewal_gap_over_half_lease_total"
            for (tb, b), (ta, a) in zip(before, after, strict=True):
                span = ta - tb
                case.requests.append(
                    (sum(a.get(name, Counter()).values()) - sum(b.get(name, Counter()).values()))
                    / span
                )
                for op, value in a.get(name, Counter()).items():
                    case.by_op[op] += (value - b.get(name, Counter())[op]) / span
                case.demotions.update(a.get("leader_sidecar_demotions_total", Counter()))
                case.gap_alerts += sum(a.get(gap, Counter()).values())
                case.gap_alerts_window += sum(a.get(gap, Counter()).values()) - sum(
                    b.get(gap, Counter()).values()
                )
            case.cpu = [100 * (c1 - c0) / elapsed for c0, c1 in zip(cpu0, cpu1, strict=True)]
            case.rss = [rss_mib(r.proc.pid) for r in replicas]
            case.held = [len(s) for s in await held(session, replicas)]
            for replica in replicas:
                series, size = await scrape_size(session, replica)
                case.series.append(series)
                case.scrape_kb.append(size / 1000)
        finally:
            await session.close()
            for replica in replicas:
                await asyncio.to_thread(replica.stop)
    return case


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(min(values), fmt)} to {format(max(values), fmt)}"


def row(case: Case) -> str:
    shape = " (per lease)" if case.per_lease else ""
    head = f"| {case.store} | {case.leases}{shape} | {case.replicas} |"
    if case.failed:
        return f"{head} did not start: {case.failed} | | | | | | |"
    led = f"{case.all_led:.2f} s" if case.all_led is not None else "never (time limit)"
    if case.replicas > 1:
        led += f" (balanced {case.balanced:.2f} s)" if case.balanced else " (never balanced)"
    demotions = {k: int(v) for k, v in case.demotions.items() if v}
    health = (
        f"demotions {demotions or 0}, gap alerts {case.gap_alerts:.0f} "
        f"({case.gap_alerts_window:.0f} in the window), "
        f"polls with a lease unled {case.unled_polls}/{case.polls}"
    )
    return (
        f"{head} {led} | {_spread(case.requests, '.1f')} | {_spread(case.cpu, '.1f')} | "
        f"{_spread(case.rss, '.0f')} | {_spread(case.series, ',')} / "
        f"{_spread(case.scrape_kb, ',.0f')} | {'/'.join(map(str, case.held))} | {health} |"
    )


HEADER = (
    "| store | leases | replicas | spawn → all led | store requests/s per replica | "
    "CPU % per replica | RSS MiB per replica | series / KB per scrape | leases held | health |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite")
    parser.add_argument("--leases", default="10,100,1000")
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--window", type=float, default=25.0)
    parser.add_argument(
        "--metrics-per-lease",
        action="store_true",
        help="also run each case with --metrics-per-lease true (every metric per lease)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each case")
    parser.add_argument("--lease-duration", default="15s", help="every replica's lease")
    parser.add_argument(
        "--settle", type=float, default=120.0, help="seconds allowed to all led and balanced"
    )
    options = parser.parse_args()
    cases = []
    for store in options.stores.split(","):
        for replicas in map(int, options.replicas.split(",")):
            for leases in map(int, options.leases.split(",")):
                for per_lease in (False, True) if options.metrics_per_lease else (False,):
                    runs = []
                    for _ in range(options.runs):
                        case = await run_case(
                            Case(store, leases, replicas, per_lease=per_lease),
                            options.window,
                            options.settle,
                            options.lease_duration,
                        )
                        ops = {k: round(v, 1) for k, v in sorted(case.by_op.items()) if v}
                        if case.server_packets is not None:
                            ops["server packets received"] = round(case.server_packets, 1)
                        print(
                            f"[{time.strftime('%H:%M:%S')}] {row(case)} requests/s by "
                            f"op:outcome, all replicas: {ops}",
                            flush=True,
                        )
                        runs.append(case)
                    cases += runs
                    if options.runs > 1:
                        print(f"[{time.strftime('%H:%M:%S')}] {summary(runs)}", flush=True)
    print()
    print(HEADER)
    for case in cases:
        print(row(case))


def lost_at_start(case: Case) -> int:
    """Leases lost to their holder's deadline or to another replica, and renewal gaps past
    half the lease, over the whole run."""
    return int(case.demotions["deadline"] + case.demotions["lost"] + case.gap_alerts)


def summary(runs: list[Case]) -> str:
    first = runs[0]
    clean = sum(1 for c in runs if not c.failed and c.balanced and not lost_at_start(c))
    led = [c.all_led for c in runs if c.all_led is not None]
    balanced = [c.balanced for c in runs if c.balanced is not None]
    return (
        f"{first.store} {first.leases} leases x {first.replicas}: {clean} of {len(runs)} runs "
        "all led and balanced with 0 deadline/lost demotions and 0 gap alerts; "
        f"deadline+lost demotions and gap alerts per run {[lost_at_start(c) for c in runs]}; "
        f"all led {_spread(led, '.1f')} s, balanced {_spread(balanced, '.1f')} s"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
