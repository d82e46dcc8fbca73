"""The loop that keeps a store's watch connection: what its owner sees between two tries."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.backends.kit.backoff import Backoff, reconnect_forever


async def test_a_failed_connection_is_closed_before_the_back_off_wait() -> None:
    """A hub that says "connected" until ``closed`` runs must not say it through the wait:
    followers would trust a view nobody keeps current."""
    events: list[str] = []
    waiting = asyncio.Event()

    async def connect() -> None:
        events.append("connect")
        if len(events) > 1:
            waiting.set()
            await asyncio.Event().wait()
        raise ConnectionError("refused")

    async def closed() -> None:
        events.append("closed")

    task = asyncio.create_task(
        reconnect_forever(
            connect,
            backoff=Backoff(0.05, 0.05, jitter=(1.0, 1.0)),
            failed=lambda exc: events.append("failed"),
            closed=closed,
        )
    )
    await asyncio.sleep(0.02)  # inside the first back-off wait (50 ms)
    assert events == ["connect", "failed", "closed"]
    await asyncio.wait_for(waiting.wait(), 1.0)
    assert events == ["connect", "failed", "closed", "connect"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events[-1] == "closed"  # a cancelled connection is closed too


async def test_a_connection_that_ends_cleanly_is_tried_again_at_once() -> None:
    tries = 0
    again = asyncio.Event()

    async def connect() -> None:
        nonlocal tries
        tries += 1
        if tries == 2:
            again.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(
        reconnect_forever(connect, backoff=Backoff(10.0, 10.0), failed=lambda exc: None)
    )
    await asyncio.wait_for(again.wait(), 1.0)  # no 10 s back-off after a clean end
    assert tries == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
