"""The supervisor (issue 25): a background task that fails is logged once, counted, restarted
after a jittered back-off, and named by ``/healthz`` while it waits."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random

import pytest
from prometheus_client import CollectorRegistry

from sidecar.supervisor import Supervisor

FAILED = "a background task failed; restarting it"


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        getattr(record, "sidecar_fields", {})
        for record in caplog.records
        if record.getMessage() == FAILED
    ]


async def until(condition: object, timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110 (a poll on purpose)
            await asyncio.sleep(0.005)


async def test_a_failing_task_is_logged_once_counted_down_meanwhile_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "sidecar.tasks")
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, backoff=(0.2, 1.0), rng=random.Random(1))
    runs = 0
    running_again = asyncio.Event()

    async def beat() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise ValueError("priority 'abc' is not an integer")
        running_again.set()
        await asyncio.Event().wait()

    task = supervisor.spawn("candidates", beat)
    try:
        await until(lambda: supervisor.down())
        assert supervisor.down() == {"candidates": "ValueError: priority 'abc' is not an integer"}
        async with asyncio.timeout(2):
            await running_again.wait()
        assert supervisor.down() == {}
        assert runs == 2
        failures = registry.get_sample_value(
            "leader_sidecar_task_failures_total", {"task": "candidates"}
        )
        assert failures == 1
        [line] = failure_lines(caplog)
        assert line["task"] == "candidates"
        assert "priority 'abc'" in str(line["error"])
        assert "ValueError" in str(line["traceback"])
        assert 0.1 <= float(line["restart_in_seconds"]) <= 0.2  # type: ignore[arg-type]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_task_that_fails_at_every_start_backs_off_and_is_logged_sparingly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The waits double to the ceiling, so such a task is down nearly all the time (and the
    kubelet restarts the sidecar); the log gets one line per 10 s, not one per failure."""
    caplog.set_level(logging.ERROR, "sidecar.tasks")
    supervisor = Supervisor(backoff=(0.01, 0.08), rng=random.Random(2))
    waits = [supervisor._delay(failures) for failures in range(1, 9)]
    ceilings = [0.01, 0.02, 0.04, 0.08, 0.08, 0.08, 0.08, 0.08]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)), waits
    starts: list[float] = []
    loop = asyncio.get_running_loop()

    async def broken() -> None:
        starts.append(loop.time())
        raise RuntimeError("every time")

    task = supervisor.spawn("balance", broken)
    try:
        await until(lambda: len(starts) >= 8)
        gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
        assert min(gaps[3:]) >= 0.04  # at the ceiling: never sooner than half of it
        assert supervisor.failures["balance"] >= 8
        assert len(failure_lines(caplog)) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert supervisor.down() == {}  # cancelled in its back-off: stopped, not down


async def test_a_task_that_returns_is_done_and_one_cancelled_stops_at_once() -> None:
    supervisor = Supervisor(backoff=(0.01, 0.01))
    calls = 0

    async def finishes() -> None:
        nonlocal calls
        calls += 1

    await asyncio.wait_for(supervisor.run("hub", finishes), 1)
    assert calls == 1
    assert supervisor.failures == {"hub": 0}

    async def forever() -> None:
        await asyncio.Event().wait()

    task = supervisor.spawn("watch", forever)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert supervisor.failures["watch"] == 0
