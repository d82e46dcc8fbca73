"""Wall-clock steps of one process: the ``clockshift.c`` LD_PRELOAD shim, built with the
system gcc at test time, and one offset file per process that the test rewrites.

Used for the Redis host (libfaketime cannot run redis-server) and for the sidecars too:
with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` libfaketime makes Python's ``time.sleep`` fail with
EINVAL (checked here: ``OSError: [Errno 22]``), and the SQLite store sleeps on its thread
while it sets up a new file, so libfaketime would crash a sidecar for a reason of its own.
The shim shifts only CLOCK_REALTIME (``clock_gettime``, ``gettimeofday``, ``time``), which is
what an NTP step or a VM resume does to a process.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.support.tools import require_binary

SOURCE = Path(__file__).with_name("clockshift.c")
REREAD = 0.005  # the shim re-reads its file at most this often (seconds of monotonic time)


def build_shim(directory: Path) -> Path:
    gcc = require_binary("gcc")
    library = directory / "clockshift.so"
    subprocess.run(
        [gcc, "-O2", "-shared", "-fPIC", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return library


class ClockShift:
    """One process's wall-clock offset, and its history (to translate the wall times that
    process reports, e.g. ``since``, back to the real clock)."""

    def __init__(self, library: Path, path: Path) -> None:
        self.library = library
        self.path = path
        self.offset = 0.0
        # (real wall time the offset took effect, offset in seconds)
        self.history: list[tuple[float, float]] = [(0.0, 0.0)]
        self._write(0.0)

    @property
    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "CLOCKSHIFT_FILE": str(self.path)}

    def step(self, seconds: float) -> None:
        """Set the offset (not add to it). Takes effect within `REREAD`."""
        self._write(seconds)
        self.offset = seconds
        self.history.append((time.time(), seconds))

    def _write(self, seconds: float) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(f"{round(seconds * 1000)}\n")
        temporary.replace(self.path)  # the shim never reads a half-written number

    def offsets(self) -> set[float]:
        return {offset for _, offset in self.history}
