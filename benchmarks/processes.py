"""Processes under test: our sidecar (`tests.support.sidecars.SidecarProcess`) and the
anchors, behind one small interface the observer and the measures use."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def compile_bytecode(root: Path = REPO) -> None:
    """Compile the sidecar's and the anchors' modules first, as the image and ``pip install``
    do: where ``PYTHONDONTWRITEBYTECODE`` is set (this project's sandbox sets it), every start
    would otherwise compile ~60 ms of our own source, which no deployed sidecar pays. The
    libraries in site-packages were compiled when they were installed."""
    import compileall

    for package in ("sidecar", "benchmarks"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


class AnchorProcess:
    """``python -m benchmarks.anchors.<module> …``; ready once it prints its listening line.
    Duck-types `SidecarProcess` where `LeaderObserver` needs it (``name``, ``proc``,
    ``leader_url``)."""

    def __init__(
        self, proc: subprocess.Popen[str], name: str, info: dict[str, str], group: bool = False
    ) -> None:
        self.proc = proc
        self.group = group  # signals go to the process group (an anchor with a child)
        self.name = name
        self.local = info["listening"]
        self.identity = info["identity"]
        self.errors: list[str] = []
        self._drain = threading.Thread(target=self._read_errors, daemon=True)
        self._drain.start()

    @classmethod
    def start(
        cls,
        module: str,
        name: str,
        args: Sequence[str],
        timeout: float = 15.0,
        group: bool = False,
    ) -> AnchorProcess:
        """``group``: the anchor runs the elector as a child (``etcdctl elect``); it gets a
        process group of its own, and every signal goes to the group."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen(
            [sys.executable, "-m", f"benchmarks.anchors.{module}", "--name", name, *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=group,
        )
        got: dict[str, str] = {}

        def first_line() -> None:
            assert proc.stdout is not None
            got["line"] = proc.stdout.readline()

        reader = threading.Thread(target=first_line, daemon=True)
        reader.start()
        reader.join(timeout)
        line = got.get("line", "")
        if not line.startswith("{"):
            proc.kill()
            _, err = proc.communicate(timeout=5)
            raise RuntimeError(f"anchor {module} did not start: {line!r} {err[-2000:]}")
        return cls(proc, name, json.loads(line), group)

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line.rstrip("\n"))
            del self.errors[:-200]

    @property
    def leader_url(self) -> str:
        return f"http://{self.local}/leader"

    def signal(self, signum: int) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)
            return
        self.proc.send_signal(signum)

    @property
    def measured_pid(self) -> int:
        """The elector's process: the child for a group anchor (its footprint, not the
        wrapper's), else the anchor itself."""
        if self.group:
            with contextlib.suppress(OSError, ValueError, IndexError):
                path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
                return int(path.read_text().split()[0])
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait(5)


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")
