"""Rolling updates: how often the lease changes hands while a Deployment replaces every replica.

    python -m benchmarks.rollout                          # every variant, 5 trials each
    python -m benchmarks.rollout --variants revision,before --trials 3

Five replicas of revision ``v1`` (real ``python -m sidecar`` processes on one SQLite file, lease
2 s) are replaced the way a Deployment with ``maxSurge: 1, maxUnavailable: 0`` does it: start
one ``v2`` replica, wait until it is ready (``/readyz`` 200 and, where the code has candidate
records, listed as a live candidate by another replica), SIGTERM one ``v1`` replica, wait for
it to exit; five times. Which ``v1`` goes next is a random order per trial (seeded: trial ``i``
uses ``--seed + i``): a ReplicaSet scaling down ranks pods of one age bucket alike and then
picks by a hash of the pod's UID, so for replicas started together that is what it looks like.
The current leader therefore goes first, last or anywhere in between.

An observer polls every replica (``/leader``, or ``/leases`` with shards) every 10 ms (20 ms
with shards). A *change* is a reign, (identity, its own ``since``), seen answering 200 whose
identity differs from the previous reign's on that lease, reigns ordered by ``since`` (not by
the moment a request was sent, which two replicas' answers can cross). The sidecars' own logs
give the grants (every ``became leader`` line, so reigns too short to be polled count too) and
the time without a leader per change: the old holder's ``stopped leading`` line to the new
holder's ``since``, both wall clock on this host, millisecond precision.

Variants: ``revision`` (today's code, ``--revision v1``/``v2``), ``no-revision`` (today's code
without ``--revision``: the successor is still the newest-started candidate), ``before`` (the
code at 08d8719, before issue 11: a release frees the lease and whichever follower writes first
takes it; check it out with ``git worktree add --detach /tmp/old 08d8719``), and ``shards``
(today's code, ``--revision``, ``--shards 16``: changes counted per shard, each change's cause
taken from the giver's ``stopped leading`` reason: ``released`` = balance, ``shutdown``).
``revision-readyz`` and ``revision-readyz-15s`` (lease 15 s, the default) take a replica as
ready on ``/readyz`` alone, as the kubelet does: the leader may not have read the new replica's
candidate record yet (it lists candidates every renew interval) when it is told to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import random
import signal
import statistics
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.sidecars import REPO, SidecarProcess, cancel_and_wait

REPLICAS = 5
LEASE = "2s"
SHARDS = 16
OLD_COMMIT = "08d8719"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    label: str
    root: Path
    revision: bool = True
    shards: int = 0
    candidates: bool = True  # the code has candidate records (GET /leases)
    listed_ready: bool = True  # ready also waits for another replica to list the new one
    lease: str = LEASE

    def args(self, revision: str) -> list[str]:
        args = ["--log-level", "info"]
        if self.revision:
            args += ["--revision", revision]
        if self.shards:
            args += ["--lease", "rollout", "--shards", str(self.shards)]
        return args

    @property
    def interval(self) -> float:
        return 0.02 if self.shards else 0.01


def variants(old_root: Path) -> dict[str, Variant]:
    return {
        v.name: v
        for v in (
            Variant("revision", "today, --revision", REPO),
            Variant("no-revision", "today, no --revision", REPO, revision=False),
            Variant(
                "before",
                f"before issue 11 ({OLD_COMMIT})",
                old_root,
                revision=False,
                candidates=False,
            ),
            Variant("shards", f"today, --revision, --shards {SHARDS}", REPO, shards=SHARDS),
            Variant(
                "revision-readyz",
                "today, --revision, ready = /readyz only",
                REPO,
                listed_ready=False,
            ),
            Variant(
                "revision-readyz-15s",
                "today, --revision, ready = /readyz only, lease 15 s",
                REPO,
                listed_ready=False,
                lease="15s",
            ),
        )
    }


def _wall(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Poller:
    """Every replica's ``/leader`` (or ``/leases``) every ``interval``; keeps each reign seen:
    (lease, identity, since) → first request sent that saw it answer 200."""

    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self.reigns: dict[tuple[str, str, float], float] = {}
        self.polls = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Poller:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=10),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._tasks)
        assert self._session is not None
        await self._session.close()

    def watch(self, replica: SidecarProcess) -> None:
        self._tasks.append(asyncio.create_task(self._poll(replica)))

    async def _poll(self, replica: SidecarProcess) -> None:
        assert self._session is not None
        url = f"http://{replica.local}{self.path}"
        while replica.proc.poll() is None:
            sent = time.time()
            try:
                async with self._session.get(url) as response:
                    body = await response.json()
                    status = response.status
            except (TimeoutError, aiohttp.ClientError, ValueError):
                await asyncio.sleep(self.interval)
                continue
            self.polls += 1
            leading = body.get("leases", [body]) if status == 200 else []
            for entry in leading:
                if entry.get("leader") and entry.get("since"):
                    key = (entry["lease"], entry["identity"], _wall(entry["since"]))
                    self.reigns.setdefault(key, sent)
            await asyncio.sleep(self.interval)

    def leaders_now(self, after: float) -> dict[str, str]:
        """Lease → identity of the latest reign first seen after ``after``."""
        latest: dict[str, tuple[float, str]] = {}
        for (lease, identity, since), _sent in self.reigns.items():
            if since >= latest.get(lease, (-1.0, ""))[0]:
                latest[lease] = (since, identity)
        return {lease: identity for lease, (since, identity) in latest.items()}


async def _get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    try:
        async with session.get(url) as response:
            return response.status, await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return 0, None


async def _until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        await asyncio.sleep(interval)


async def _ready(
    session: aiohttp.ClientSession,
    new: SidecarProcess,
    others: list[SidecarProcess],
    variant: Variant,
) -> None:
    """``/readyz`` 200 and, with candidate records, listed live by another replica."""

    async def ready() -> bool:
        status, _ = await _get_json(session, f"http://{new.public}/readyz")
        if status != 200:
            return False
        if not variant.candidates or not variant.listed_ready:
            return True
        for other in others:
            _, body = await _get_json(session, f"http://{other.local}/leases")
            if body and any(
                c["identity"] == new.identity and c["live"] for c in body.get("candidates", [])
            ):
                return True
        return False

    await _until(ready, 30, f"{new.name} ready")


@dataclasses.dataclass
class Change:
    lease: str
    giver: str
    receiver: str
    gap: float | None  # seconds from the giver's "stopped leading" to the receiver's reign
    cause: str  # the giver's demotion reason


@dataclasses.dataclass
class Trial:
    variant: str
    seed: int
    order: list[str]  # v1 replicas in the order they were terminated
    leader_position: int | None  # 1-based position of the first leader in that order
    changes: list[Change]
    grants: int  # "became leader" lines after the first grant of each lease
    leases: int
    seconds: float
    final: dict[str, int]  # replica → leases it leads at the end
    warnings: list[str]  # the sidecars' warning and error lines, shortened

    @property
    def to_old(self) -> int:
        """Changes that handed a lease to a v1 replica, which must hand it on again."""
        return sum(1 for c in self.changes if c.receiver.startswith("v1-"))

    def per_lease(self) -> list[int]:
        counts = Counter(c.lease for c in self.changes)
        return [counts.get(lease, 0) for lease in self._lease_names()]

    def _lease_names(self) -> list[str]:
        if self.leases == 1:
            return ["default"]
        return [f"rollout-{i}" for i in range(self.leases)]


def _changes(poller: Poller, replicas: list[SidecarProcess], after: float = 0.0) -> list[Change]:
    stops: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for replica in replicas:
        for entry in replica.logs:
            if entry.get("msg") == "stopped leading":
                key = (entry["lease"], entry["identity"])
                stops.setdefault(key, []).append((_wall(entry["ts"]), entry.get("reason", "")))
    by_lease: dict[str, list[tuple[float, str]]] = {}
    for lease, identity, since in poller.reigns:
        by_lease.setdefault(lease, []).append((since, identity))
    changes = []
    for lease, reigns in by_lease.items():
        reigns.sort()
        for (_, before), (since, receiver) in itertools.pairwise(reigns):
            if before == receiver or since < after:  # the start-up's own spreading is no change
                continue
            # the giver's last demotion at or before the receiver's reign (ms rounding: +2 ms)
            stopped = [s for s in stops.get((lease, before), []) if s[0] <= since + 0.002]
            moment, cause = max(stopped) if stopped else (None, "unseen")
            gap = since - moment if moment is not None else None
            changes.append(Change(lease, before, receiver, gap, cause))
    return changes


def _grants(replicas: list[SidecarProcess]) -> int:
    leases: Counter[str] = Counter()
    for replica in replicas:
        for entry in replica.logs:
            if entry.get("msg") == "became leader":
                leases[entry["lease"]] += 1
    return sum(n - 1 for n in leases.values())


async def _led_by(poller: Poller, running: list[SidecarProcess], leases: int) -> bool:
    leaders = poller.leaders_now(0)
    alive = {r.identity for r in running}
    return len(leaders) == leases and set(leaders.values()) <= alive


def _warnings(replicas: list[SidecarProcess]) -> list[str]:
    lines = []
    for replica in replicas:
        for entry in replica.logs:
            if entry.get("level") in ("warning", "error"):
                extra = {k: v for k, v in entry.items() if k in ("lease", "gap_seconds", "error")}
                lines.append(f"{entry['ts'][11:23]} {replica.name}: {entry['msg']} {extra}")
    return sorted(lines)


async def trial(variant: Variant, seed: int, workdir: Path) -> Trial:
    rng = random.Random(seed)
    store = f"sqlite:///{workdir}/lease.db"
    began = time.monotonic()
    everyone: list[SidecarProcess] = []
    running: list[SidecarProcess] = []
    leases = variant.shards or 1

    async def start(name: str, revision: str) -> SidecarProcess:
        replica = await asyncio.to_thread(
            SidecarProcess.start,
            name,
            store,
            lease_duration=variant.lease,
            args=variant.args(revision),
            root=variant.root,
        )
        everyone.append(replica)
        running.append(replica)
        poller.watch(replica)
        return replica

    path = "/leases" if variant.shards else "/leader"
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    try:
        async with Poller(path, variant.interval) as poller:
            for i in range(REPLICAS):
                await start(f"v1-{i}", "v1")

            async def all_led() -> bool:
                return len(poller.leaders_now(0)) == leases

            await _until(all_led, 30, "every lease led")
            if variant.shards:  # the start-up's spreading over the v1 replicas comes to rest

                async def level() -> bool:
                    held = Counter(poller.leaders_now(0).values())
                    return len(poller.leaders_now(0)) == leases and max(held.values()) <= -(
                        -leases // REPLICAS
                    )

                await _until(level, 60, "the v1 replicas level")
            await asyncio.sleep(2.0)  # a lease: every replica has seen every candidate
            first = poller.leaders_now(0)
            rollout_began = time.time()
            order = rng.sample(list(running), len(running))
            position = None
            if leases == 1:
                leader = first["default"]
                position = next(i + 1 for i, r in enumerate(order) if r.identity == leader)
            for step, old in enumerate(order):
                new = await start(f"v2-{step}", "v2")
                await _ready(session, new, [r for r in running if r is not new], variant)
                old.signal(signal.SIGTERM)
                code = await asyncio.to_thread(old.proc.wait, 20)
                running.remove(old)
                if code != 0:
                    print(f"  {old.name} exited with {code}", flush=True)
            # the last hand-over's reign is polled (a named successor that is gone makes the
            # others stand back for the transfer timeout first)
            with contextlib.suppress(RuntimeError):
                await _until(lambda: _led_by(poller, running, leases), 30, "led by a v2")
            await asyncio.sleep(1.0)
            final = Counter(poller.leaders_now(0).values())
    finally:
        await session.close()
        for replica in everyone:
            await asyncio.to_thread(replica.stop)
    return Trial(
        variant.name,
        seed,
        [r.name for r in order],
        position,
        _changes(poller, everyone, rollout_began),
        _grants(everyone),
        leases,
        time.monotonic() - began,
        {identity.split("_")[0]: n for identity, n in sorted(final.items())},
        _warnings(everyone),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def report(variant: Variant, trials: list[Trial]) -> str:
    n = len(trials)
    counts = [len(t.changes) for t in trials]
    gaps = [c.gap for t in trials for c in t.changes if c.gap is not None]
    gap = _ms(statistics.median(gaps)) if gaps else "—"
    gap_max = _ms(max(gaps)) if gaps else "—"
    grants = [t.grants for t in trials]
    to_old = statistics.mean(t.to_old for t in trials)
    if variant.shards:
        per_shard = [x for t in trials for x in t.per_lease()]
        causes = Counter(c.cause for t in trials for c in t.changes)
        cause = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(causes.items()))
        back = Counter(c.cause for t in trials for c in t.changes if c.receiver.startswith("v1-"))
        to_old_causes = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(back.items()))
        return (
            f"| {variant.label} | {n} | per shard {statistics.mean(per_shard):.2f}, "
            f"max {max(per_shard)} (all {SHARDS} shards: {statistics.mean(counts):.1f} per "
            f"rollout, max {max(counts)}; by cause per rollout: {cause}; to a v1 replica "
            f"{to_old:.1f}: {to_old_causes}) | "
            f"{statistics.mean(grants):.1f} | {gap} (max {gap_max}) |"
        )
    positions = ",".join(str(t.leader_position) for t in trials)
    return (
        f"| {variant.label} | {n} | {statistics.mean(counts):.1f}, max {max(counts)} "
        f"(per trial {','.join(map(str, counts))}; leader's place in the order {positions}; "
        f"to a v1 replica {to_old:.1f}) "
        f"| {statistics.mean(grants):.1f} | {gap} (max {gap_max}) |"
    )


HEADER = (
    "| variant | trials | leader changes per rollout (mean, max) | grants per rollout "
    "(sidecar logs) | time without a leader per change, median ms |\n|---|---|---|---|---|"
)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="revision,no-revision,before,shards")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--old-root", type=Path, default=Path("/tmp/old"))
    options = parser.parse_args()
    known = variants(options.old_root)
    chosen = [known[name] for name in options.variants.split(",")]
    if any(not v.candidates for v in chosen) and not (options.old_root / "sidecar").is_dir():
        raise SystemExit(
            f"{options.old_root} has no checkout: git worktree add --detach "
            f"{options.old_root} {OLD_COMMIT}"
        )
    results: dict[str, list[Trial]] = {}
    for variant in chosen:
        for i in range(options.trials):
            with tempfile.TemporaryDirectory(prefix="rollout-") as workdir:
                one = await trial(variant, options.seed + i, Path(workdir))
            results.setdefault(variant.name, []).append(one)
            summary = [
                (c.lease, c.giver.split("_")[0], c.receiver.split("_")[0], c.cause)
                for c in one.changes
            ]
            gaps = [_ms(c.gap) if c.gap is not None else "?" for c in one.changes]
            print(
                f"[{time.strftime('%H:%M:%S')}] {variant.name} trial {i} (seed "
                f"{one.seed}, {one.seconds:.0f} s): order {one.order}, leader's place "
                f"{one.leader_position}, {len(one.changes)} changes, {one.grants} grants, "
                f"{one.to_old} to v1, gaps ms {gaps}, final {one.final}"
                + ("" if variant.shards else f", {summary}"),
                flush=True,
            )
            for line in one.warnings[:20]:
                print(f"    {line}", flush=True)
    print()
    print(HEADER)
    for variant in chosen:
        print(report(variant, results[variant.name]))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
