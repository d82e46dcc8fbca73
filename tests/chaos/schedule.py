"""The fault schedule: drawn from a seed, so a run can be replayed (``CHAOS_SEED=…``).

The seed fixes which faults come in which order, whom they target (the leader, or which
follower by rank), how long they last, the size of clock steps and the pauses between
faults. It cannot fix the timing of real processes: a replay is the same schedule, not the
same interleaving.
"""

from __future__ import annotations

import dataclasses
import os
import random

# Faults every store gets: they act on the sidecar processes.
PROCESS_KINDS = ("sigkill", "sigstop", "sigterm", "clock_step_sidecar")

# The app-fault round's kinds (its own run per store, every sidecar checking an app of its
# own): the target's app killed then restarted, hung (SIGSTOP, SIGCONT), flapping (fast,
# then slow), and every app down at once, then back one by one.
APP_KINDS = ("app_kill", "app_hang", "app_flap", "apps_down")

CLOCK_STEPS = (5.0, 30.0, 600.0, 3600.0)  # seconds, either direction


@dataclasses.dataclass(frozen=True)
class FaultSpec:
    index: int
    kind: str
    target: str  # "leader" or "follower"
    pick: float  # which follower, as a fraction of the followers sorted by slot name
    hold: float  # seconds the fault lasts (a pause, a stall, a partition, a step)
    step: float  # signed seconds of a clock step
    gap: float  # seconds between the two halves of a "twice" fault
    settle: float  # seconds after recovery before the next fault (varies its phase)

    def describe(self) -> str:
        parts = [f"#{self.index:03d} {self.kind}"]
        if self.kind in ("sigkill", "sigstop", "sigterm", "clock_step_sidecar") or (
            self.kind.startswith(("partition", "app_"))
        ):
            parts.append(f"target={self.target}")
        if (
            self.kind in ("sigstop", "store_stall", "store_pause", "api_5xx", "late_write")
            or self.kind in ("app_kill", "app_hang")
            or self.kind in ("member_sigkill", "member_sigstop", "quorum_lost", "member_partition")
            or self.kind == "ensemble_restart"
            or (self.kind.startswith(("partition", "clock_step")))
        ):
            parts.append(f"hold={self.hold:.2f}s")
        if self.kind.startswith("clock_step"):
            parts.append(f"step={self.step:+g}s")
        if self.kind.endswith("_twice"):
            parts.append(f"gap={self.gap:.2f}s")
        return " ".join(parts)


def base_seed() -> int:
    """``CHAOS_SEED`` if set, else a fresh one (printed by the run, so it can be replayed)."""
    raw = os.environ.get("CHAOS_SEED")
    if raw:
        return int(raw)
    return random.SystemRandom().randrange(1, 2**31)


def fault_count(default: int) -> int:
    """Faults per run: ``CHAOS_FAULTS`` is per store, shared by that store's runs."""
    return int(os.environ.get("CHAOS_FAULTS", default))


def shard_count(default: int = 16) -> int:
    """Shards in the sharded run: ``CHAOS_SHARDS``, else 16."""
    return int(os.environ.get("CHAOS_SHARDS", default))


def app_fault_count(default: int = 8) -> int:
    """Faults in a store's app-fault round: ``CHAOS_APP_FAULTS``; else, in long mode, a
    quarter of ``CHAOS_FAULTS`` (an app fault cycle takes longer than most); else
    ``default`` (every app kind twice)."""
    if os.environ.get("CHAOS_APP_FAULTS"):
        return int(os.environ["CHAOS_APP_FAULTS"])
    if os.environ.get("CHAOS_FAULTS"):
        return max(default, int(os.environ["CHAOS_FAULTS"]) // 4)
    return default


def draw(
    seed: int, store: str, kinds: tuple[str, ...], count: int, lease: float
) -> list[FaultSpec]:
    """A store's ``count`` faults (its runs take consecutive slices). Every kind comes once,
    in a random order, before any comes twice, so even a short run covers them all."""
    rng = random.Random(f"{seed}/{store}")
    order: list[str] = []
    while len(order) < count:
        batch = list(kinds)
        rng.shuffle(batch)
        order.extend(batch)
    specs = []
    for index, kind in enumerate(order[:count], start=1):
        specs.append(
            FaultSpec(
                index=index,
                kind=kind,
                # Mostly the leader: that is where safety is at stake.
                target="leader" if rng.random() < 0.7 else "follower",
                pick=rng.random(),
                hold=lease * rng.uniform(1.5, 2.5),
                step=rng.choice(CLOCK_STEPS) * rng.choice((1, -1)),
                gap=rng.uniform(0.2, 0.5),
                settle=rng.uniform(0.2, 0.8),
            )
        )
    return specs
