"""The sidecar's footprint on Kubernetes, with real processes against the fake API server (in
its own process): RSS of the leader and the followers of three sidecars after ~10 s (VmRSS),
start → first HTTP answer, and start → leader on an empty store (medians of several starts),
with the CPU time the process had used by its first answer (user + system, from
/proc/<pid>/stat): on a busy machine the wall-clock times stretch, the CPU time much less.

    python -m benchmarks.footprint [--tree DIR] [--starts 7] [--settle 10] [--nice -10]

``--tree`` runs the sidecar from another checkout (e.g. an export of an older commit) to
compare before and after on the same machine; the fake always comes from this one. ``--nice``
runs the sidecars at that niceness (negative needs root): on a machine shared with other work
it shows what the sidecar itself costs, as on a node with CPU to spare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from benchmarks.processes import compile_bytecode, rss_mib
from tests.fakekube import FakeKubeProcess

NAMESPACE = "demo"
LEASE = "footprint"
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Sidecar:
    def __init__(self, tree: Path, kubeconfig: Path, name: str, nice: int = 0) -> None:
        self.port = _free_port()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
        environment.pop("KUBERNETES_SERVICE_HOST", None)
        environment["PYTHONPATH"] = str(tree)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "sidecar", "--store", "kubernetes",
                "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--lease", LEASE,
                "--identity", name, "--pod-name", name, "--lease-duration", "3s",
                "--listen", f"127.0.0.1:{self.port}", "--public-listen", "127.0.0.1:0",
            ],
            cwd=tree, env=environment, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )  # fmt: skip

    def leader(self) -> bool | None:
        """True/False from ``/leader``; None when nothing answers yet."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/leader", timeout=1) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError as error:
            return bool(error.code == 200)
        except OSError:
            return None

    def cpu(self) -> float:
        """User + system CPU seconds used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait(self, leader: bool, timeout: float = 20.0) -> float:
        """Seconds from spawn until the first answer (``leader`` False) or until it leads."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.leader()
            if answer is not None and (answer or not leader):
                return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}")
            time.sleep(0.005)
        raise TimeoutError("no answer" if not leader else "never led")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def fake_api() -> Iterator[tuple[FakeKubeProcess, Path]]:
    fake = FakeKubeProcess.start()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            yield fake, fake.kubeconfig(Path(tmp) / "kubeconfig", NAMESPACE)
        finally:
            fake.stop()


def measure(tree: Path, starts: int, settle: float, nice: int = 0) -> dict[str, object]:
    with fake_api() as (fake, kubeconfig):
        for i in range(3):
            fake.create_pod(NAMESPACE, f"fp-{i}")
        first_answer, to_leader, cpu = [], [], []
        for i in range(starts):
            fake.delete_lease(NAMESPACE, LEASE)
            sidecar = Sidecar(tree, kubeconfig, f"fp-{i % 3}", nice)
            try:
                first_answer.append(sidecar.wait(leader=False))
                cpu.append(sidecar.cpu())
                to_leader.append(sidecar.wait(leader=True))
            finally:
                sidecar.stop()
        fake.delete_lease(NAMESPACE, LEASE)
        pool = [Sidecar(tree, kubeconfig, f"fp-{i}", nice) for i in range(3)]
        try:
            for sidecar in pool:
                sidecar.wait(leader=False)
            time.sleep(settle)
            leaders = [s for s in pool if s.leader()]
            assert len(leaders) == 1, "expected one leader"
            leader_rss = rss_mib(leaders[0].proc.pid)
            follower_rss = [rss_mib(s.proc.pid) for s in pool if s is not leaders[0]]
        finally:
            for sidecar in pool:
                sidecar.stop()
    return {
        "tree": str(tree),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "nice": nice,
        "rss_leader_mib": round(leader_rss, 1),
        "rss_followers_mib": [round(r, 1) for r in follower_rss],
        "start_to_first_answer_s": {
            "median": round(statistics.median(first_answer), 3),
            "all": [round(t, 3) for t in first_answer],
        },
        "cpu_to_first_answer_s": {
            "median": round(statistics.median(cpu), 3),
            "all": [round(t, 3) for t in cpu],
        },
        "start_to_leader_s": {
            "median": round(statistics.median(to_leader), 3),
            "all": [round(t, 3) for t in to_leader],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=REPO)
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args()
    compile_bytecode(args.tree.resolve())
    print(json.dumps(measure(args.tree.resolve(), args.starts, args.settle, args.nice), indent=2))


if __name__ == "__main__":
    main()
