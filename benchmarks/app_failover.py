"""Leadership follows the app (issue 30): the leader's app fails; how long until a replica
whose app is up leads?

    python -m benchmarks.app_failover                        # every store and fault: ~17 min
    python -m benchmarks.app_failover --stores redis --faults hung --trials 3

Three replicas on one store (an SQLite file, one ``redis-server``, the in-repo fake Kubernetes
API server), each a real ``leader-sidecar`` process beside its own tiny app
(`benchmarks.tiny_app`: an HTTP server on loopback). Ours: sidecars with ``--app-health-url``
naming their own app, the app check's defaults (period 1 s, timeout 1 s, 3 failures, 1
success) and the default lease (15 s). A trial: every app answers and every sidecar says its
app is up (``leader_sidecar_app_up``), the leader is found and counts both others as live
successors (`settle`), the replicas are quiet (`measures.quiet`), a random moment within one
check period passes, then the fault on the leader's app:

* killed: SIGKILL (every check is refused at once); started again on its port afterwards;
* hung: SIGSTOP (connections wait in its listen backlog, each check times out); SIGCONT after;
* unready: it answers 503 (SIGUSR1); 200 again after (SIGUSR2).

Measured: the fault → the first 200 on ``/leader`` from another replica (whose app is up), as
the observer polling every replica every 10 ms receives it. Logged with each trial, from the
sidecars' own logs: the fault → the old leader's "the app is down" → its "stopped leading"
(and why) → the successor's reign (its ``since``). The faults take turns within each round of
trials, so all three see the same stretch of machine noise. Two more rows do not wait for
the leader's view: ``--fresh-trials`` (the app of the leader just handed the lease, which led
before, killed at once) and ``--first-trials`` (a new pool each: two app failures in a row, the
second on a replica leading for the first time, `first_reign`).

Theirs: the same three replicas and apps, sidecars without an app check (what an elector that
does not look at the app does): the same fault on the leader's app; does the lease move within
``--anchor-wait`` seconds (more than a lease)? One trial per fault and store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.measures import Pool, quiet
from benchmarks.processes import REPO, compile_bytecode
from benchmarks.report import Cell, Row, duration, table
from benchmarks.systems import (
    KubeStore,
    OursOnKube,
    OursOnRedis,
    OursOnSqlite,
    RedisStore,
    SqliteStore,
    _free_port,
)
from tests.support.sidecars import SidecarProcess

STORES = ("sqlite", "redis", "kubernetes")
FAULTS = ("killed", "hung", "unready")
LEASE = 15.0  # the sidecar's default
PERIOD, TIMEOUT, FAILURES = 1.0, 1.0, 3  # the app check's defaults (not passed: defaults)
TARGET = FAILURES * PERIOD + 0.1  # the failures in a row, then one hand-off

FRESH = "killed, fresh leader"  # the row of trials on a leader that was just handed the lease
FIRST = "killed, first reign"  # … on a replica that was just handed the lease for the first time
FAULT_TEXT = {
    "killed": "app killed (SIGKILL)",
    "hung": "app hung (SIGSTOP)",
    "unready": "app unready (answers 503)",
    FRESH: "app killed right after a hand-over to this leader (no wait for its view of the "
    "others; it led before)",
    FIRST: "app killed right after a replica leads for the first time (a second app "
    "failure right after a first, on a new pool)",
}
STORE_TEXT = {"sqlite": "SQLite", "redis": "Redis", "kubernetes": "K8s (fake API)"}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the apps ------------------------------------------------------------------------------------


class App:
    """One slot's tiny app on a port of its own that stays the same for the run (its sidecar's
    ``--app-health-url`` names it), so a killed app comes back where its sidecar looks."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.tiny_app", "--port", str(self.port)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the tiny app on port {self.port} did not start")
            time.sleep(0.02)

    def answers(self) -> bool:
        """It answers 200 now (a blocking call, for the harness's threads)."""
        try:
            with urllib.request.urlopen(self.url, timeout=0.5) as response:
                return bool(response.status == 200)
        except OSError:  # refused, timed out, or an HTTPError (a 503)
            return False

    def _signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def fault(self, kind: str) -> None:
        if kind == "killed":
            self._signal(signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(5)
        elif kind == "hung":
            self._signal(signal.SIGSTOP)
        else:
            self._signal(signal.SIGUSR1)

    def restore(self, kind: str) -> None:
        if kind == "killed":
            self.start()
        elif kind == "hung":
            self._signal(signal.SIGCONT)
        else:
            self._signal(signal.SIGUSR2)

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
            proc.wait(5)


@contextlib.contextmanager
def running_apps(count: int) -> Iterator[list[App]]:
    apps = [App(_free_port()) for _ in range(count)]
    try:
        for app in apps:
            app.start()
        yield apps
    finally:
        for app in apps:
            app.stop()


# -- the stores ----------------------------------------------------------------------------------

AnySystem = OursOnSqlite | OursOnRedis | OursOnKube


class Store:
    """One store of the run and our sidecar's systems on it (a lease name each)."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.store: SqliteStore | RedisStore | KubeStore
        if kind == "sqlite":
            self.store = SqliteStore(tmp)
        elif kind == "redis":
            self.store = RedisStore(tmp)
        elif kind == "kubernetes":
            self.store = KubeStore(tmp)
        else:
            raise SystemExit(f"--stores: unknown store {kind!r} ({', '.join(STORES)})")

    def system(self, lease_name: str, apps: Sequence[App], app_check: bool) -> AnySystem:
        """Our sidecar at the default lease; with ``app_check``, each slot's sidecar checks the
        app of its slot (`Pool` names the slots "0", "1", "2")."""
        store = self.store
        system: AnySystem
        if isinstance(store, SqliteStore):
            system = OursOnSqlite(store, lease_name)
        elif isinstance(store, RedisStore):
            system = OursOnRedis(store, lease_name)
        else:
            system = OursOnKube(store, lease_name)
        system.lease = LEASE
        system.renew = LEASE / 3
        if app_check:
            system.extra_args = lambda slot: ["--app-health-url", apps[int(slot)].url]
        return system

    def close(self) -> None:
        self.store.close()


@contextlib.asynccontextmanager
async def pool_of(system: AnySystem) -> AsyncIterator[Pool]:
    """`Pool`, whose replicas are stopped also when one of them fails to start."""
    pool = Pool(system)
    try:
        await pool.__aenter__()
        yield pool
    finally:
        await pool.__aexit__(None, None, None)


# -- one trial -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trial:
    fault: str
    answered: float | None  # fault → first 200 from another replica (None: not within the cap)
    reign: float | None = None  # fault → the successor's own `since`
    detected: float | None = None  # fault → the old leader's "the app is down"
    stopped: float | None = None  # fault → the old leader's "stopped leading"
    reason: str | None = None  # why it stopped leading
    quiet: float = 0.0  # seconds waited for quiet replicas before the fault
    settled: float = 0.0  # seconds waited for the leader to count the others live (`settle`)
    led_for: float = 0.0  # how long the leader had led when its app failed


async def app_up_metric(session: aiohttp.ClientSession, replica: SidecarProcess) -> bool:
    try:
        async with session.get(f"http://{replica.public}/metrics") as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return False
    return re.search(r"^leader_sidecar_app_up(\{[^}]*\})? 1(\.0)?$", text, re.M) is not None


async def everyone_up(
    session: aiohttp.ClientSession,
    pool: Pool,
    apps: Sequence[App],
    app_check: bool,
    timeout: float = 30.0,
) -> None:
    """Every app answers 200 and (``app_check``) every sidecar says its app is up."""
    deadline = time.monotonic() + timeout
    while True:
        answering = await asyncio.gather(*(asyncio.to_thread(app.answers) for app in apps))
        checked = await asyncio.gather(
            *(app_up_metric(session, r) for r in pool.replicas if isinstance(r, SidecarProcess))
        )
        if all(answering) and (not app_check or all(checked)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every app up after {timeout:g} s: {answering} {checked}")
        await asyncio.sleep(0.1)


async def settle(
    session: aiohttp.ClientSession, leader: SidecarProcess, others: int, timeout: float = 40.0
) -> float:
    """Wait until the leader's candidate view (``GET /leases``) counts ``others`` other
    replicas live, not leaving, with their app up: the successors a hand-over may pick. A
    replica counts as live once its record's version was seen to change (`CandidateView.live`),
    so a leader that has just been handed the lease (a follower does not follow the group)
    counts nobody for up to a candidate beat. Returns the seconds waited."""
    began = time.monotonic()
    while True:
        try:
            async with session.get(f"http://{leader.local}/leases") as response:
                body = await response.json()
            ready = [
                c
                for c in body.get("candidates") or []
                if c["identity"] != body["identity"]
                and c["live"]
                and not c["leaving"]
                and c["app"] == "up"
            ]
            if len(ready) >= others:
                return time.monotonic() - began
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{leader.name} did not count {others} successors in {timeout:g} s")
        await asyncio.sleep(0.1)


def _log_moment(
    replica: SidecarProcess, message: str, after: float
) -> tuple[float, dict[str, Any]] | None:
    """The first log line ``message`` stamped at or after ``after`` (ms precision: 1 ms of
    slack), with its fields."""
    for entry in list(replica.logs):
        if entry.get("msg") != message:
            continue
        moment = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
        if moment >= after - 0.001:
            return moment, entry
    return None


def _app_of(pool: Pool, apps: Sequence[App], replica: object) -> App:
    return apps[int(pool.slots[replica.name])]  # type: ignore[attr-defined]


async def failover(
    session: aiohttp.ClientSession,
    pool: Pool,
    apps: Sequence[App],
    fault: str,
    cap: float,
    rng: random.Random,
    settled_view: bool = True,
) -> Trial:
    """Ours: the fault on the leader's app → a replica whose app is up answers 200.
    ``settled_view``: first wait until the leader counts the others as successors
    (`settle`); else fault it as soon as it leads and everyone's app is up."""
    await everyone_up(session, pool, apps, app_check=True)
    led, leader = await pool.leader()
    assert isinstance(leader, SidecarProcess)
    settled = await settle(session, leader, len(pool.replicas) - 1) if settled_view else 0.0
    waited = await quiet([pool])
    await asyncio.sleep(rng.uniform(0, PERIOD))  # a random phase of the checks' period
    app = _app_of(pool, apps, leader)
    began = time.time()
    app.fault(fault)
    led_for = began - led.since
    try:
        try:
            successor = await pool.observer.wait_for(
                lambda s: s.leader and s.name != leader.name and s.sent >= began, timeout=cap
            )
        except AssertionError:
            _log(f"  {fault}: no other replica answered 200 within {cap:g} s")
            return Trial(fault, None, quiet=waited, settled=settled, led_for=led_for)
        await asyncio.sleep(0.2)  # the sidecars' log lines are read on threads
    finally:
        await asyncio.to_thread(app.restore, fault)
    down = _log_moment(leader, "the app is down", began)
    stopped = _log_moment(leader, "stopped leading", began)
    if down is not None and stopped is not None and stopped[0] - down[0] > 0.1:
        # The hand-over waited after the verdict: say on what (the leader's own lines).
        for entry in leader.logs:
            moment = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
            if down[0] - 0.001 <= moment <= stopped[0] + 0.001:
                _log(f"    {leader.name}: {entry}")
    return Trial(
        fault,
        answered=successor.received - began,
        reign=successor.since - began,
        detected=None if down is None else down[0] - began,
        stopped=None if stopped is None else stopped[0] - began,
        reason=None if stopped is None else stopped[1].get("reason"),
        quiet=waited,
        settled=settled,
        led_for=led_for,
    )


async def first_reign(
    session: aiohttp.ClientSession,
    store: Store,
    apps: Sequence[App],
    number: int,
    cap: float,
    rng: random.Random,
) -> tuple[Trial, int]:
    """A new pool (a lease and candidate group of its own): the first leader's app is killed
    (once its view is settled), and as soon as the replica it handed the lease to — leading
    for the first time, so it has not followed the group before — leads and every app is up
    again, that replica's app is killed too. Returns the second trial, and the pairs of 200s
    that prove two leaders at once in the pool."""
    system = store.system(f"bench-first-{number}", apps, app_check=True)
    async with pool_of(system) as pool:
        await failover(session, pool, apps, "killed", cap, rng)
        trial = await failover(session, pool, apps, "killed", cap, rng, settled_view=False)
        return trial, len(pool.observer.two_leaders_at_once())


async def stays(
    session: aiohttp.ClientSession, pool: Pool, apps: Sequence[App], fault: str, wait: float
) -> tuple[float | None, bool]:
    """Theirs (no app check): the fault on the leader's app → another replica answers 200
    (None: not within ``wait``); and whether the old leader still answered 200 at the end."""
    await everyone_up(session, pool, apps, app_check=False)
    _, leader = await pool.leader()
    app = _app_of(pool, apps, leader)
    began = time.time()
    app.fault(fault)
    try:
        try:
            other = await pool.observer.wait_for(
                lambda s: s.leader and s.name != leader.name and s.sent >= began, timeout=wait
            )
            moved: float | None = other.received - began
        except AssertionError:
            moved = None
        last = [s for s in pool.observer.samples if s.name == leader.name]
        still = bool(last) and last[-1].leader and last[-1].sent >= began + wait - 1.0
    finally:
        await asyncio.to_thread(app.restore, fault)
    return moved, still


# -- the run -------------------------------------------------------------------------------------


@dataclasses.dataclass
class StoreResult:
    kind: str
    trials: dict[str, list[Trial]]
    anchors: dict[str, tuple[float | None, bool]]
    overlaps: int  # pairs of 200s proving two leaders at one instant (ours)


async def bench_store(kind: str, tmp: Path, args: argparse.Namespace) -> StoreResult:
    faults = args.faults.split(",")
    rng = random.Random(args.seed)
    cap = LEASE + 5.0  # past the lease: the old leader's lease would have run out by then
    store = Store(kind, tmp)
    trials: dict[str, list[Trial]] = {f: [] for f in faults}
    if args.fresh_trials:
        trials[FRESH] = []
    if args.first_trials:
        trials[FIRST] = []
    anchors: dict[str, tuple[float | None, bool]] = {}
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        with running_apps(3) as apps:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                overlaps = 0
                if args.trials:
                    ours = store.system("bench-app", apps, app_check=True)
                    async with pool_of(ours) as pool:
                        for i in range(args.trials):
                            for fault in faults:
                                trial = await failover(session, pool, apps, fault, cap, rng)
                                trials[fault].append(trial)
                                _log(f"{kind} {fault} #{i + 1}: {_describe(trial)}")
                            if i < args.fresh_trials:
                                # The successor of the trial just done leads since a second
                                # or two; its app fails with no wait for its view (`settle`).
                                trial = await failover(
                                    session, pool, apps, "killed", cap, rng, settled_view=False
                                )
                                trials[FRESH].append(trial)
                                _log(f"{kind} {FRESH} #{i + 1}: {_describe(trial)}")
                        overlaps = len(pool.observer.two_leaders_at_once())
                for i in range(args.first_trials):
                    trial, pairs = await first_reign(session, store, apps, i, cap, rng)
                    trials[FIRST].append(trial)
                    overlaps += pairs
                    _log(f"{kind} {FIRST} #{i + 1}: {_describe(trial)}")
                if args.anchor_wait > 0:
                    plain = store.system("bench-plain", apps, app_check=False)
                    async with pool_of(plain) as pool:
                        for fault in faults:
                            anchors[fault] = await stays(
                                session, pool, apps, fault, args.anchor_wait
                            )
                            moved, still = anchors[fault]
                            _log(
                                f"{kind} {fault}, no app check: moved "
                                f"{'never' if moved is None else duration(moved)}, still the "
                                f"old leader {args.anchor_wait:g} s after: {still}"
                            )
    finally:
        store.close()
    return StoreResult(kind, trials, anchors, overlaps)


def _describe(trial: Trial) -> str:
    def at(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    return (
        f"answered {at(trial.answered)} s (down {at(trial.detected)}, stopped "
        f"{at(trial.stopped)} [{trial.reason}], reign {at(trial.reign)}; waited "
        f"{trial.settled:.2f} s for the leader's view, {trial.quiet:.2f} s for quiet; it had "
        f"led {trial.led_for:.2f} s)"
    )


def rows_of(result: StoreResult, wait: float) -> list[Row]:
    rows: list[Row] = []
    for fault, trials in result.trials.items():
        if not trials:
            continue
        if fault in (FRESH, FIRST):
            theirs = Cell([], note="as for killed")
        elif fault not in result.anchors:
            theirs = Cell([], note="not run")
        else:
            moved, still = result.anchors[fault]
            after = f"{wait:g} s after the fault"
            theirs = (
                Cell([moved], note="(n=1)")
                if moved is not None
                else Cell(
                    [],
                    note=f"never (n=1: still the old leader {after})"
                    if still
                    else f"never (n=1: nobody else led within {after})",
                )
            )
        rows.append(
            (
                f"{STORE_TEXT[result.kind]}: {FAULT_TEXT[fault]} → a replica whose app is up "
                "answers 200",
                Cell([t.answered for t in trials], never=f"no successor within {LEASE + 5:g} s"),
                theirs,
            )
        )
    return rows


def breakdown(results: Sequence[StoreResult]) -> str:
    """Medians of where each row's time went, from the sidecars' own logs."""

    def med(values: Sequence[float | None]) -> str:
        got = [v for v in values if v is not None]
        return duration(statistics.median(got)) if got else "—"

    lines = [
        "| store, fault | fault → app down (check) | → stopped leading | → successor's reign "
        "| → its 200 seen | demotion reasons | met ≤ "
        f"{TARGET:g} s |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for fault, trials in result.trials.items():
            if not trials:
                continue
            reasons = sorted({t.reason or "none" for t in trials})
            done = [t.answered for t in trials]
            met = sum(1 for v in done if v is not None and v <= TARGET)
            lines.append(
                f"| {STORE_TEXT[result.kind]}, {fault} | {med([t.detected for t in trials])} | "
                + med([_gap(t.stopped, t.detected) for t in trials])
                + " | "
                + med([_gap(t.reign, t.stopped) for t in trials])
                + " | "
                + med([_gap(t.answered, t.reign) for t in trials])
                + f" | {', '.join(reasons)} | {met} of {len(done)} |"
            )
    return "\n".join(lines)


def _gap(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def _source() -> str:
    """The commit measured, and whether sidecar/ differs from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "sidecar"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{REPO} (not a git checkout)"
    return f"{head}{' + uncommitted changes in sidecar/' if dirty else ''}"


async def main_async(args: argparse.Namespace) -> list[StoreResult]:
    task = asyncio.current_task()
    assert task is not None
    # SIGTERM ends the run like Ctrl-C: every `finally` above stops what it started.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    results = []
    with tempfile.TemporaryDirectory(prefix="app-failover-") as tmp_name:
        for kind in args.stores.split(","):
            _log(f"store {kind}")
            (Path(tmp_name) / kind).mkdir()
            results.append(await bench_store(kind, Path(tmp_name) / kind, args))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--trials", type=int, default=10, help="per store and fault")
    parser.add_argument(
        "--anchor-wait",
        type=float,
        default=20.0,
        help="seconds the sidecar without an app check is watched per fault (0: skip)",
    )
    parser.add_argument(
        "--fresh-trials",
        type=int,
        default=5,
        help="per store: the app of a leader just handed the lease killed at once (0: skip)",
    )
    parser.add_argument(
        "--first-trials",
        type=int,
        default=3,
        help="per store: a new pool each, two app failures in a row (`first_reign`; 0: skip)",
    )
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        raise SystemExit(f"--faults: unknown {sorted(unknown)} ({', '.join(FAULTS)})")
    compile_bytecode()
    source = _source()
    load_before = os.getloadavg()
    began = time.monotonic()
    results = asyncio.run(main_async(args))
    load_after = os.getloadavg()
    rows = [row for result in results for row in rows_of(result, args.anchor_wait)]
    print()
    print(
        table(
            rows,
            columns=(
                "measure: fault → 200 elsewhere (median / max)",
                "ours (app check: period 1 s, 3 failures; lease 15 s)",
                "without an app check (lease 15 s)",
            ),
        )
    )
    print()
    print(breakdown(results))
    overlaps = {r.kind: r.overlaps for r in results}
    print(
        f"\n{args.trials} trials per store and fault (max = the slowest); target ≤ "
        f"{TARGET:g} s; two leaders at once (pairs of 200s): {overlaps}; sidecar at {source}; "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; {time.monotonic() - began:.0f} s; command: python -m "
        f"benchmarks.app_failover --stores {args.stores} --faults {args.faults} --trials "
        f"{args.trials} --fresh-trials {args.fresh_trials} --first-trials {args.first_trials} "
        f"--anchor-wait {args.anchor_wait:g} --seed {args.seed}"
    )


if __name__ == "__main__":
    main()
