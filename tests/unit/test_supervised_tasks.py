"""Every background task of a running sidecar comes back after it fails (issue 25): each is
broken once from inside (a stand-in for a bug or a record nobody expected), and the test sees
the failure counted, ``/healthz`` answer 503 naming the task while it waits, and the task run
again."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.api import CHANGES
from sidecar.app import Sidecar
from sidecar.backends.memory import MemoryStoreClient
from sidecar.backends.sqlite import SQLiteStoreClient
from sidecar.config import load


class Once:
    """Stands in for ``original``: raises on its first call, then delegates (counting)."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        self.failed = False
        self.calls_after = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("broken on purpose")
        self.calls_after += 1
        return self.original(*args, **kwargs)


@dataclasses.dataclass
class Breaker:
    """How to break one task once, what nudges it to run into the break, and how to tell
    it runs again."""

    task: str
    store: str  # memory | sqlite
    break_it: Callable[[Sidecar], Once]
    nudge: Callable[[Sidecar], None] = lambda sidecar: None


def _patch(owner: Any, name: str) -> Once:
    once = Once(getattr(owner, name))
    setattr(owner, name, once)
    return once


def _feed(sidecar: Sidecar) -> Once:
    """The feed's look at every lease (`ChangeFeed._look`) fails once."""
    return _patch(sidecar.listeners[0].runner.app[CHANGES], "_look")


def _actions(sidecar: Sidecar) -> Once:
    class Noted:
        name = "noted"
        after_release = False

        async def __call__(self, transition: object) -> None:
            pass

    sidecar.actions.actions.append(Noted())  # nothing is queued without an action
    return _patch(sidecar.actions, "_apply")


def _release_a(sidecar: Sidecar) -> None:
    if "a" in sidecar.leases.held():
        asyncio.get_running_loop().create_task(sidecar.leases.release("a"))


BREAKERS = [
    Breaker(
        "candidates",
        "memory",
        lambda s: _patch(s.leases.beat.registry, "beat"),  # type: ignore[union-attr]
        lambda s: s.leases.beat.wake(),  # type: ignore[union-attr]
    ),
    Breaker(
        "candidates-follow",
        "memory",
        lambda s: _patch(s.leases.beat, "_needs_list"),  # type: ignore[arg-type]
        lambda s: s.leases.beat.wake_follow(),  # type: ignore[union-attr]
    ),
    Breaker(
        "balance",
        "memory",
        lambda s: _patch(s.leases, "_plan"),
        lambda s: s.leases._candidates_changed(),
    ),
    Breaker("lease-watch", "memory", lambda s: _patch(s.elector, "on_watch")),
    Breaker("change-feed", "memory", _feed),
    Breaker("demotion-actions", "memory", _actions, _release_a),
    Breaker("sqlite-watch", "sqlite", lambda s: _patch(s.client.hub, "_look")),  # type: ignore
]


async def healthz(session: aiohttp.ClientSession, sidecar: Sidecar) -> tuple[int, Any]:
    async with session.get(f"http://{sidecar.addresses['public']}/healthz") as response:
        return response.status, await response.json()


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda b: b.task)
async def test_a_task_that_fails_is_named_by_healthz_counted_and_runs_again(
    tmp_path: Path, breaker: Breaker
) -> None:
    config = load(
        [
            "--store", f"sqlite:///{tmp_path / 'leases.db'}",
            "--lease", "a,b,c",
            "--lease-duration", "1s",
            "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0",
        ],
        environ={},
    )  # fmt: skip
    client = MemoryStoreClient() if breaker.store == "memory" else None
    sidecar = Sidecar(config, client=client)
    sidecar.open()  # (`start` would open the store after listening; the test needs it now)
    sidecar.supervisor.backoff = (0.6, 0.6)  # down 0.3-0.6 s: long enough to be seen
    if breaker.store == "sqlite":
        assert isinstance(sidecar.client, SQLiteStoreClient)
    await sidecar.start()
    try:
        async with asyncio.timeout(10):
            while len(sidecar.leases.held()) < 3:  # noqa: ASYNC110 (a poll on purpose)
                await asyncio.sleep(0.02)
        broken = breaker.break_it(sidecar)
        seen_down: list[Any] = []
        async with aiohttp.ClientSession() as session, asyncio.timeout(10):
            while not seen_down:
                breaker.nudge(sidecar)
                status, body = await healthz(session, sidecar)
                if status == 503:
                    seen_down.append(body)
                await asyncio.sleep(0.01)
            while broken.calls_after == 0 or sidecar.supervisor.down():
                breaker.nudge(sidecar)
                await asyncio.sleep(0.02)
            status, body = await healthz(session, sidecar)
        assert status == 200, body
        assert seen_down[0]["down"] == {breaker.task: "RuntimeError: broken on purpose"}
        assert breaker.task in seen_down[0]["error"]
        failures = sidecar.registry.get_sample_value(
            "leader_sidecar_task_failures_total", {"task": breaker.task}
        )
        assert failures == 1
        assert sidecar.supervisor.failures[breaker.task] == 1
    finally:
        await sidecar.stop()
