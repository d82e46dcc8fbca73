"""Leadership follows the app, as a user runs it: real sidecar processes on one SQLite file,
watched every 10 ms, with the app's heartbeat made by this test's own calls, and the
operator's `leader-sidecar hold` / `resume` run as commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.sidecars import SidecarProcess, observing, sidecars

pytestmark = pytest.mark.slow

LEASE = 1.0
HEARTBEAT = 0.5


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leases.db'}"


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


class Poller:
    """An app that asks its sidecar every 100 ms until stopped: its heartbeat."""

    def __init__(self, sidecar: SidecarProcess) -> None:
        self.sidecar = sidecar
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running.is_set():
            with contextlib.suppress(OSError):
                get(self.sidecar.leader_url)
            time.sleep(0.1)

    def stop(self) -> None:
        self.running.clear()
        self.thread.join(2)


async def until(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} not within {timeout}s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def leads(sidecar: SidecarProcess) -> bool:
    """Asked on the public listener: a call to the localhost API is the app's heartbeat."""
    try:
        return get(sidecar.public_leader_url)[0] == 200
    except OSError:
        return False


async def test_sigterm_drains_until_the_app_has_stopped_then_hands_over(tmp_path: Path) -> None:
    """503 at once on SIGTERM; the lease stays (nobody else leads) while the app still calls;
    once its heartbeat stops the lease moves, and the sidecar exits 0. GET / names the pod."""
    args = ["--app-heartbeat", f"{HEARTBEAT}s", "--drain-timeout", "10s"]
    with sidecars(["a", "b"], store_url(tmp_path), args=args) as procs:
        apps = [Poller(p) for p in procs]
        try:
            async with observing(procs, public=True) as observer:
                await until(lambda: any(s.leader for s in observer.samples), 5, "a leader")
                leader = next(p for p in procs if leads(p))
                other = next(p for p in procs if p is not leader)
                app = apps[procs.index(leader)]
                assert get(other.leader_url.removesuffix("/leader") + "/")[1]["name"] == (
                    leader.name
                )
                leader.signal(signal.SIGTERM)
                await until(lambda: not leads(leader), 0.5, "503 at once")
                await asyncio.sleep(3 * LEASE)  # the app still works: nobody else may lead
                assert not leads(other)
                assert leader.proc.poll() is None
                app.stop()
                await until(lambda: leads(other), HEARTBEAT + 3.0, "the other leads")
                assert await asyncio.to_thread(leader.wait_exit, 5) == 0
                observer.assert_never_two_leaders()
        finally:
            for app in apps:
                app.stop()
    drained = [line for line in leader.logs if line.get("msg") == "drain ended"]
    assert [line.get("outcome") for line in drained] == ["app_stopped"]


async def command(*argv: str) -> subprocess.CompletedProcess[str]:
    """``leader-sidecar ARGV`` as an operator runs it (off the loop: the observer polls on)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


async def test_hold_stops_every_replica_and_resume_lets_one_lead_again(tmp_path: Path) -> None:
    store = store_url(tmp_path)
    with sidecars(["a", "b", "c"], store) as procs:
        async with observing(procs) as observer:
            await until(lambda: any(s.leader for s in observer.samples), 5, "a leader")
            held = await command("hold", "--store", store, "--for", "1h", "--reason", "migration 7")
            assert held.returncode == 0, held.stderr
            returned = time.monotonic()
            # Nobody answers 200 within one retry period of `hold` returning.
            await until(lambda: not any(leads(p) for p in procs), 0.5, "nobody leads")
            assert time.monotonic() - returned < 0.5
            await asyncio.sleep(3 * LEASE)
            assert not any(leads(p) for p in procs)
            status = await command("status", "--store", store, "-o", "json")
            assert status.returncode == 0, status.stderr
            (lease,) = json.loads(status.stdout)["leases"]
            assert lease["state"] == "on hold"
            assert lease["hold"]["reason"] == "migration 7"
            assert lease["hold"]["by"]
            resumed = await command("resume", "--store", store)
            assert resumed.returncode == 0, resumed.stderr
            await until(lambda: any(leads(p) for p in procs), 2 * LEASE, "a leader after resume")
            seen = len(observer.samples)
            await until(
                lambda: any(s.leader for s in observer.samples[seen:]), 1, "the observer sees it"
            )
        terms = [
            line.get("term") for p in procs for line in p.logs if line.get("msg") == "became leader"
        ]
        assert terms[-1] > lease["term"]  # above the hold's
        stopped = [
            line.get("reason")
            for p in procs
            for line in p.logs
            if line.get("msg") == "stopped leading"
        ]
        assert stopped == ["hold"]
