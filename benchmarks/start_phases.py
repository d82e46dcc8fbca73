"""Where a sidecar's start-up CPU goes, phase by phase, up to its first grant: the CPU time
(``time.process_time``, every thread) at each step of one start, medians of several starts in
fresh interpreters. The first three phases are what the bare app of `benchmarks.start_floor`
imports too; the rest is ours. The listeners answer from ``listeners started``: the store's
client is built after it.

    python -m benchmarks.start_phases --store sqlite:////tmp/x.db [--starts 7] [-- FLAGS…]

FLAGS go to the sidecar (``--kubeconfig F``). Each start runs on a lease of its own; a network
store need not answer for the phases up to ``listening``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import uuid

from benchmarks.processes import REPO, compile_bytecode

# Run in the child: stamps the CPU time at each phase, prints them as JSON, exits at the
# first grant (or after the first attempts, when the store does not grant).
_CHILD = r"""
import json, sys, time
stamps = [("interpreter and site", time.process_time())]
def mark(name):
    stamps.append((name, time.process_time()))
import asyncio; mark("import asyncio")
import prometheus_client; mark("import prometheus_client")
import aiohttp.web; mark("import aiohttp.web")
import sidecar.cli as cli; mark("import sidecar.cli")
import sidecar.app as app; mark("import sidecar.app")

def done():
    print(json.dumps(stamps), flush=True)
    raise SystemExit(0)

build = app.Sidecar.__init__
def init(self, *args, **kwargs):
    mark("configuration read")
    build(self, *args, **kwargs)
    mark("Sidecar(): metrics, app check")
app.Sidecar.__init__ = init
open_store = app.Sidecar.open
def opened(self):
    mark("listeners started (first answer)")
    open_store(self)
    mark("store client, electors")
    # (imported here, not above: the sidecar imports them after its first answer)
    import sidecar.lease_set as lease_set
    from sidecar.status import Role
    prime = lease_set.LeaseSet.prime
    async def primed(self, timeout):
        mark("listeners serve the leases")
        def led(transition):
            if transition.role is Role.LEADER:
                mark("first grant")
                done()
        for elector in self.electors.values():
            elector.on_transition(led)
        await prime(self, timeout)
        asyncio.get_running_loop().call_later(3, done)
    lease_set.LeaseSet.prime = primed
app.Sidecar.open = opened
cli.main(sys.argv[1:])
"""


def one_start(args: list[str]) -> dict[str, float]:
    lease = f"phases-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, "-c", _CHILD, *args, "--lease", lease, "--identity", lease,
        "--listen", "127.0.0.1:0", "--public-listen", "127.0.0.1:0", "--log-level", "warning",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEADER_SIDECAR_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    ).stdout
    stamps = json.loads(out.strip().splitlines()[-1])
    phases = {stamps[0][0]: stamps[0][1] * 1000}
    for (_, before), (name, at) in itertools.pairwise(stamps):
        phases[name] = (at - before) * 1000
    phases["total"] = stamps[-1][1] * 1000
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("flags", nargs="*", help="further flags for the sidecar")
    args = parser.parse_args()
    compile_bytecode()
    starts = [one_start(["--store", args.store, *args.flags]) for _ in range(args.starts)]
    print(f"CPU ms, median of {args.starts} starts ({args.store}; load {os.getloadavg()[0]:.1f})")
    for name in starts[0]:
        values = [s[name] for s in starts if name in s]
        print(f"  {name:40} {statistics.median(values):6.1f}")


if __name__ == "__main__":
    main()
