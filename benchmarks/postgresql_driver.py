"""How the PostgreSQL store's driver was chosen: asyncpg beside psycopg 3 (async), each in a
fresh process that imports what the sidecar imports, then the driver, connects, LISTENs and
makes one conditional grant (the store's first steps). Prints, per driver, the median of
several runs: import time, start → first grant, and RSS after it; and beside them our sidecar
itself on PostgreSQL, SQLite and Redis (start → leader, RSS of the leader after ~3 s).

    python -m benchmarks.postgresql_driver [--runs 7]

Needs both drivers (``pip install asyncpg 'psycopg[binary]'``), postgresql-15 and
redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.processes import REPO, compile_bytecode, rss_mib
from tests.postgresql.servers import PostgresServer
from tests.redis.servers import RedisServer
from tests.support.sidecars import LeaderObserver, SidecarProcess

# One process per run: the sidecar's own imports, then the driver's, then its first grant.
PROBE = r"""
import json, re, sys, time
began = time.perf_counter()
import aiohttp.web, prometheus_client, sidecar.app  # what every sidecar imports
base = time.perf_counter()
driver, url = sys.argv[1], sys.argv[2]
TABLE = "CREATE TABLE IF NOT EXISTS probe (name text PRIMARY KEY, holder text, term bigint)"
GRANT = ("INSERT INTO probe (name, holder, term) VALUES ('l', 'me', 1) "
         "ON CONFLICT (name) DO UPDATE SET term = probe.term + 1 RETURNING term")
if driver == "asyncpg":
    import asyncio, asyncpg
    imported = time.perf_counter()
    async def main():
        conn = await asyncpg.connect(url)
        await conn.add_listener("probe", lambda *a: None)
        await conn.execute(TABLE)
        await conn.fetchval(GRANT)
        await conn.close()
    asyncio.run(main())
else:
    import asyncio, psycopg
    imported = time.perf_counter()
    async def main():
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await conn.execute("LISTEN probe")
        await conn.execute(TABLE)
        await (await conn.execute(GRANT)).fetchone()
        await conn.close()
    asyncio.run(main())
done = time.perf_counter()
rss = int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 1024
print(json.dumps({"import": imported - base, "grant": done - began, "rss": rss}))
"""


def probe(driver: str, url: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, driver, url],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


async def sidecar_start(store: str, name: str) -> tuple[float, float]:
    """(start → leader seconds, RSS MiB after ~3 s) of one sidecar on an empty lease."""
    began = time.time()
    proc = SidecarProcess.start(name, store, lease_duration="3s", args=["--lease", name])
    try:
        async with LeaderObserver([proc]) as observer:
            sample = await observer.leader(timeout=20)
            await_time = time.time()
        await asyncio.sleep(max(0.0, 3 - (await_time - began)))
        return sample.since - began, rss_mib(proc.proc.pid)
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    compile_bytecode()
    server = PostgresServer.start()
    redis_dir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    redis = RedisServer.start(redis_dir)
    try:
        database = server.new_database("bench")
        url = server.url(database)
        rows: list[tuple[str, str, str, str]] = []
        for driver in ("asyncpg", "psycopg"):
            runs = [probe(driver, url) for _ in range(args.runs)]
            rows.append(
                (
                    f"driver {driver}: import / start → first grant / RSS",
                    f"{1000 * statistics.median(r['import'] for r in runs):.0f} ms",
                    f"{1000 * statistics.median(r['grant'] for r in runs):.0f} ms",
                    f"{statistics.median(r['rss'] for r in runs):.1f} MiB",
                )
            )
        for label, store in (
            ("postgresql", url),
            ("sqlite", f"sqlite:///{redis_dir / 'bench.db'}"),
            ("redis", redis.url),
        ):
            runs2 = [
                asyncio.run(sidecar_start(store, f"bench-{label}-{i}")) for i in range(args.runs)
            ]
            rows.append(
                (
                    f"sidecar on {label}: start → leader / RSS",
                    "",
                    f"{1000 * statistics.median(r[0] for r in runs2):.0f} ms",
                    f"{statistics.median(r[1] for r in runs2):.1f} MiB",
                )
            )
        for row in rows:
            print(" | ".join(row))
    finally:
        redis.stop()
        server.destroy()


if __name__ == "__main__":
    main()
