"""`GET /leader` throughput beside its floor: a bare aiohttp handler answering the same bytes
with the same headers (`anchors/bare_leader.py`), and optionally an older checkout's sidecar,
in the same run. Each sidecar runs alone on an embedded SQLite file and leads; every round
runs `wrk -t2 -c32` for ``--seconds`` against each process in turn, in a rotating order.

    python -m benchmarks.leader_throughput [--runs 6] [--seconds 2] [--before DIR]

Besides requests per second, the CPU time each server process spent per request (from
/proc): on 2 cores shared with wrk's threads (``--threads``, 2 by default), the requests per
second move with how the scheduler shares the cores; the CPU per request moves much less.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.processes import REPO, compile_bytecode
from benchmarks.start_floor import _cpu, _free_port


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)


def _until_answers(url: str, want: int | None = None, timeout: float = 20.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if want is None or answer.status == want:
                    return bytes(answer.read())
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: no answer within {timeout:g}s")
        time.sleep(0.05)


def _sidecar(name: str, tree: Path, tmp: Path) -> Server:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "--listen", f"127.0.0.1:{port}",
         "--public-listen", f"127.0.0.1:{_free_port()}", "--lease", name,
         "--store", f"sqlite:///{tmp / (name + '.db')}"],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = Server(name, proc, f"http://127.0.0.1:{port}/leader")
    _until_answers(server.url, want=200)
    return server


def _bare(tmp: Path, like: Server) -> Server:
    """The bare handler answers our leader's bytes and headers, so both write the same."""
    with urllib.request.urlopen(like.url, timeout=2) as answer:
        body = answer.read()
        headers = [f"{k}:{answer.headers[k]}" for k in ("Content-Type", "ETag", "Cache-Control")]
    (tmp / "body.json").write_bytes(body)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.anchors.bare_leader", "--port", str(port),
         "--body-file", str(tmp / "body.json"),
         *[a for h in headers for a in ("--header", h)]],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    server = Server("bare aiohttp handler", proc, f"http://127.0.0.1:{port}/leader")
    _until_answers(server.url)
    return server


def _wrk(server: Server, seconds: int, threads: int) -> None:
    before = _cpu(server.proc.pid)
    out = subprocess.run(
        ["wrk", f"-t{threads}", "-c32", f"-d{seconds}s", server.url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    spent = _cpu(server.proc.pid) - before
    count = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert count, out
    assert rps, out
    server.rps.append(float(rps.group(1)))
    server.cpu_us.append(spent / int(count.group(1)) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads")
    parser.add_argument("--before", type=Path, help="an older checkout, measured beside")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not installed: apt-get install -y wrk")
    trees = [("ours", REPO)] + ([("before", args.before.resolve())] if args.before else [])
    for _, tree in trees:
        compile_bytecode(tree)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        servers = [_sidecar(name, tree, tmp) for name, tree in trees]
        servers.append(_bare(tmp, servers[0]))
        try:
            load = [os.getloadavg()[0]]
            for run in range(args.runs):
                for server in servers[run % len(servers) :] + servers[: run % len(servers)]:
                    _wrk(server, args.seconds, args.threads)
                load.append(os.getloadavg()[0])
        finally:
            for server in servers:
                server.proc.terminate()
                server.proc.wait(10)
    bare = servers[-1]
    print("| server | requests/s, median (range) | ÷ bare | CPU per request, median µs | "
          "bare ÷ it |\n|---|---:|---:|---:|---:|")  # fmt: skip
    for server in servers:
        rps, cpu = statistics.median(server.rps), statistics.median(server.cpu_us)
        print(
            f"| {server.name} | {rps:,.0f} ({min(server.rps):,.0f} to {max(server.rps):,.0f}) | "
            f"{rps / statistics.median(bare.rps):.2f} | {cpu:.1f} | "
            f"{statistics.median(bare.cpu_us) / cpu:.2f} |"
        )
    print(
        f"\n{args.runs} runs of `wrk -t{args.threads} -c32 -d{args.seconds}s` each, "
        f"interleaved; load average {min(load):.1f} to {max(load):.1f}"
    )


if __name__ == "__main__":
    main()
