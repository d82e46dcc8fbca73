"""Stray signals cannot move leadership, and a repeated stop signal changes nothing about an
orderly exit (issue 12, item 7). Two real sidecars on one SQLite file."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.support.sidecars import SidecarProcess, observing, sidecars

pytestmark = pytest.mark.slow


def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leases.db'}"


def count(sidecar: SidecarProcess, msg: str, **fields: object) -> int:
    return sum(
        1
        for entry in sidecar.logs
        if entry.get("msg") == msg and all(entry.get(k) == v for k, v in fields.items())
    )


async def test_sighup_and_sigusr_signals_leave_the_leader_leading(tmp_path: Path) -> None:
    with sidecars(["a", "b"], store_url(tmp_path), lease_duration="2s") as procs:
        async with observing(procs) as observer:
            before = await observer.leader()
            leader = next(p for p in procs if p.name == before.name)
            for signum in (signal.SIGHUP, signal.SIGUSR2):
                leader.signal(signum)
                leader.wait_log(
                    lambda e, s=signum: (
                        e.get("msg") == "signal ignored"
                        and e.get("signal") == signal.Signals(s).name
                    )
                )
            leader.signal(signal.SIGUSR1)
            dump = leader.wait_log(lambda e: e.get("msg") == "state")
            assert dump["leader"] is True
            assert dump["term"] == before.term
            assert set(dump["listeners"]) == {"local", "public"}
            sent = time.time()
            after = await observer.leader(after=sent)
            assert after.name == before.name
            assert after.term == before.term
            assert leader.proc.poll() is None
            assert count(leader, "stopped leading") == 0


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
async def test_a_second_stop_signal_during_shutdown_exits_0_and_releases_once(
    tmp_path: Path, second: int
) -> None:
    with sidecars(["a", "b"], store_url(tmp_path), lease_duration="2s") as procs:
        async with observing(procs) as observer:
            before = await observer.leader()
            leader = next(p for p in procs if p.name == before.name)
            began = time.time()
            leader.signal(signal.SIGTERM)
            await asyncio.sleep(0.02)  # the timing: 20 ms after the first
            leader.signal(second)
            assert await asyncio.to_thread(leader.wait_exit, 5) == 0  # the observer keeps polling
            # Released, not expired: like test_sigterm_of_the_leader_hands_off_within_a_second.
            successor = await observer.wait_for(
                lambda s: s.leader and s.name != before.name and s.sent >= began, timeout=3
            )
            assert successor.term is not None
            assert before.term is not None
            assert successor.term > before.term
            leader.wait_log(lambda e: e.get("msg") == "stopped")
            assert count(leader, "stopped", released=True) == 1
            assert count(leader, "stopped leading", reason="shutdown") == 1
