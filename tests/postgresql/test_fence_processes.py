"""The fence's promise with real processes: **a write committed under term T never commits after
a grant of a term above T has committed** — with the old leader paused (SIGSTOP) inside its
transactions, with it partitioned from the database, and with 50 concurrent app transactions
in flight at a hand-over.

Three "pods" (a real sidecar and a real app, `fenced_app`, side by side; lease 1 s) on one
database. Each app runs 50 connections, each looping over one transaction: fence, insert into
``app_writes``, 50 ms of work, commit; it acts on its sidecar's last answer, so a paused or
cut-off pod keeps writing with its old term. A trigger on ``leader_sidecar.grants`` records,
inside every grant's own transaction, how many writes of a lower term were committed at that
moment (`grant_log`). The property holds iff that count never grows later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.chaos.proxy import TcpProxy
from tests.postgresql.conftest import Database
from tests.postgresql.fenced_app import APP_TABLES
from tests.support.sidecars import LeaderObserver, SidecarProcess
from tests.support.tools import REPO

pytestmark = pytest.mark.slow

LEASE = "1s"
WORKERS = 50

GRANT_LOG = """
CREATE TABLE grant_log (term bigint NOT NULL, lower_writes bigint NOT NULL);
CREATE FUNCTION log_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO grant_log SELECT NEW.term, count(*) FROM app_writes WHERE term < NEW.term;
    RETURN NULL;
END $$;
CREATE TRIGGER log_grant AFTER INSERT OR UPDATE ON leader_sidecar.grants
    FOR EACH ROW EXECUTE FUNCTION log_grant();
"""


@dataclass
class Pod:
    name: str
    sidecar: SidecarProcess
    app: subprocess.Popen[str]
    proxy: TcpProxy | None

    def pause(self) -> None:
        self.sidecar.pause()
        os.kill(self.app.pid, signal.SIGSTOP)

    async def stop(self) -> None:
        for pid in (self.app.pid, self.sidecar.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.app.terminate()
        try:
            await asyncio.to_thread(self.app.wait, 10)
        except subprocess.TimeoutExpired:
            self.app.kill()
            await asyncio.to_thread(self.app.wait, 5)
        await asyncio.to_thread(self.sidecar.stop)
        if self.proxy is not None:
            await self.proxy.stop()


async def start_pod(name: str, database: Database, *, proxied: bool) -> Pod:
    """A sidecar and its app; with ``proxied``, both reach the database through one proxy
    (the pod's network), so the test can cut the pod off."""
    proxy = None
    url = database.url
    if proxied:
        proxy = await TcpProxy("127.0.0.1", database.server.port, name).start()
        url = url.replace(f"127.0.0.1:{database.server.port}", proxy.address)
    sidecar = await asyncio.to_thread(
        SidecarProcess.start, name, url, lease_duration=LEASE, args=["--log-level", "info"]
    )
    app = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "tests.postgresql.fenced_app", "--leader", sidecar.leader_url,
         "--db", url, "--workers", str(WORKERS), "--hold", "0.05", "--name", name],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert app.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(app.stdout.readline), 30)
    assert json.loads(line) == {"ready": name}, line
    return Pod(name, sidecar, app, proxy)


async def wait_for_writes(database: Database, term: int, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        written = int(database.sql(f"SELECT count(*) FROM app_writes WHERE term = {term}"))
        if written >= count:
            return
        assert time.monotonic() < deadline, f"only {written} writes under term {term}"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["sigstop", "partition", "handover"])
async def test_a_write_under_a_term_never_commits_after_a_newer_grant(
    fault: str, database: Database
) -> None:
    """No write fenced with term T commits after a grant of a higher term has committed."""
    created = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", "postgresql-schema", "--store", database.url],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    database.sql(APP_TABLES + GRANT_LOG)
    pods: list[Pod] = []
    try:
        for i in range(3):
            pods.append(await start_pod(f"pod-{i}", database, proxied=fault == "partition"))
        async with LeaderObserver([pod.sidecar for pod in pods]) as observer:
            first = await observer.leader(timeout=20)
            assert first.term is not None
            old = next(pod for pod in pods if pod.name == first.name)
            await wait_for_writes(database, first.term, 200, timeout=20)
            if fault == "sigstop":
                # Paused with its transactions open: the others try to take over meanwhile.
                old.pause()
                await asyncio.sleep(2.0)
                os.kill(old.app.pid, signal.SIGCONT)  # the app goes on with its old answer
                await asyncio.sleep(1.0)
                old.sidecar.resume()
            elif fault == "partition":
                assert old.proxy is not None
                old.proxy.set_mode("blackhole")
                await asyncio.sleep(2.5)
                old.proxy.set_mode("open")
            else:
                old.sidecar.terminate()  # a hand-over while 50 transactions are in flight
            new = await observer.wait_for(
                lambda s: s.leader and (s.term or 0) > (first.term or 0), timeout=30
            )
            assert new.term is not None
            await wait_for_writes(database, new.term, 50, timeout=20)
            observer.assert_never_two_leaders()
    finally:
        await asyncio.gather(*(pod.stop() for pod in pods))
    grants = [
        tuple(int(v) for v in line.split("|"))
        for line in database.sql(
            f"SELECT term, lower_writes FROM grant_log WHERE term > {first.term} ORDER BY term"
        ).splitlines()
    ]
    assert grants, "no grant after the fault"
    old_writes = int(database.sql(f"SELECT count(*) FROM app_writes WHERE term = {first.term}"))
    assert old_writes >= 200
    for term, seen in grants:
        final = int(database.sql(f"SELECT count(*) FROM app_writes WHERE term < {term}"))
        assert final == seen, (
            f"{final - seen} write(s) under a term below {term} committed after the grant of "
            f"term {term} ({fault})"
        )
