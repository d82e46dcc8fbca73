"""The apps of the app-fault round: one tiny app process per slot (`app_server.py`), and the
harness's exact record of when each was up, which both the writer beside it (the app's own
view: a dead, hung or unready app does not write) and the judge read.

An app is *up* at an instant when its process runs (not killed, not SIGSTOPped) and its mode
answers 200 then. The record is a list of changes (time, process state, mode); a flapping
mode is up or down by the same formula the app itself uses.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

APP_SERVER = Path(__file__).with_name("app_server.py")
START_TIMEOUT = 15.0  # an interpreter start on a loaded two-core machine

# The sidecars' app check in this round, short to fit the 1 s lease: a dead or hung app is
# seen down within FAILURES x PERIOD + TIMEOUT (0.4 s), a live one up within one period.
PERIOD = 0.1
TIMEOUT = 0.1
FAILURES = 3
DOWN_WITHIN = FAILURES * PERIOD + TIMEOUT

RUNNING, HUNG, DEAD = "running", "hung", "dead"


@dataclasses.dataclass(frozen=True)
class AppMode:
    """What a running app answers: ``up`` (200), ``down`` (503) or ``flap`` (503 for ``down``
    seconds, then 200 for ``up`` seconds, over and over from ``origin``)."""

    kind: str = "up"
    origin: float = 0.0
    down: float = 0.0
    up: float = 0.0

    def up_at(self, moment: float) -> bool:
        if self.kind == "up":
            return True
        if self.kind == "flap":
            return (moment - self.origin) % (self.down + self.up) >= self.down
        return False

    def up_within(self, start: float, end: float) -> list[tuple[float, float]]:
        """The parts of ``[start, end)`` during which this mode answers 200."""
        if self.kind == "up":
            return [(start, end)]
        if self.kind != "flap":
            return []
        cycle = self.down + self.up
        first = self.origin + ((start - self.origin) // cycle) * cycle
        found = []
        while first < end:
            low, high = max(start, first + self.down), min(end, first + cycle)
            if low < high:
                found.append((low, high))
            first += cycle
        return found


UP = AppMode("up")
DOWN = AppMode("down")


class App:
    """One slot's app process, restartable on its port, and its record of changes."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.mode_file = directory / f"app-{name}.json"
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.pids: list[int] = []
        self.state = DEAD
        self.mode = UP
        # (time, process state, mode): every change, in order.
        self.changes: list[tuple[float, str, AppMode]] = []
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._incarnation = 0

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def sidecar_args(self) -> list[str]:
        """The flags that point this slot's sidecar at this app."""
        return [
            "--app-health-url", self.health_url,
            "--app-health-period", f"{PERIOD * 1000:g}ms",
            "--app-health-timeout", f"{TIMEOUT * 1000:g}ms",
            "--app-health-failures", str(FAILURES),
        ]  # fmt: skip

    def _note(self, state: str | None = None, mode: AppMode | None = None) -> None:
        self.state = state or self.state
        self.mode = mode or self.mode
        self.changes.append((time.time(), self.state, self.mode))

    def set_mode(self, mode: AppMode) -> None:
        """Answer as ``mode`` from now on (the file is replaced in one step)."""
        scratch = self.mode_file.with_suffix(".tmp")
        scratch.write_text(json.dumps(dataclasses.asdict(mode)))
        os.replace(scratch, self.mode_file)
        self._note(mode=mode)

    async def start(self) -> None:
        """Start the process (on its old port after the first time); returns once it
        listens. The mode is left as it was: a restarted app answers as its file says."""
        if not self.mode_file.exists():
            self.mode_file.write_text(json.dumps(dataclasses.asdict(self.mode)))
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = await asyncio.to_thread(self._spawn)
        self.pids.append(self.proc.pid)
        line = await asyncio.wait_for(
            asyncio.to_thread(self.proc.stdout.readline),  # type: ignore[union-attr]
            START_TIMEOUT,
        )
        assert line.startswith("listening "), f"app {self.name} did not start: {line!r}"
        self.port = int(line.split()[1])
        self._incarnation += 1
        self._note(state=RUNNING)

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(APP_SERVER), str(self.mode_file), str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)  # a hung app dies too
            self.proc.kill()
        self.proc.wait(5)
        self._note(state=DEAD)
        self._thawed.set()  # a frozen write dies with the app

    def hang(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self._thawed.clear()
        self._note(state=HUNG)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self._note(state=RUNNING)
        self._thawed.set()

    def up_at(self, moment: float) -> bool:
        index = bisect.bisect_right([c[0] for c in self.changes], moment) - 1
        if index < 0:
            return False
        _at, state, mode = self.changes[index]
        return state == RUNNING and mode.up_at(moment)

    def up_now(self) -> bool:
        return self.state == RUNNING and self.mode.up_at(time.time())

    async def may_write(self) -> bool:
        """The app's own view before each write of its fenced writer: a dead or unready app
        does not write; a hung one is frozen right there (the answer it holds goes out when
        it thaws, a stale write the fence must refuse) unless it is killed meanwhile."""
        incarnation = self._incarnation
        await self._thawed.wait()
        return self._incarnation == incarnation and self.up_now()

    def up_intervals(self, end: float) -> list[tuple[float, float]]:
        """When the app was up, from its first start to ``end``."""
        found: list[tuple[float, float]] = []
        for index, (at, state, mode) in enumerate(self.changes):
            until = self.changes[index + 1][0] if index + 1 < len(self.changes) else end
            if state == RUNNING and at < until:
                found.extend(mode.up_within(at, until))
        merged: list[list[float]] = []
        for low, high in found:
            if merged and low <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        return [(low, high) for low, high in merged]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
