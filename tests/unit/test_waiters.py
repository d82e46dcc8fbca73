"""Long-poll waiters wake only when their answer changes (issue 12, item 5): before, every
waiter on the leader woke at each renewal, because each renewal moved its deadline."""

from __future__ import annotations

import asyncio
import contextlib

from sidecar.api import create_local_app
from sidecar.backends.memory import MemoryLeaseState
from sidecar.elector import Elector
from sidecar.limits import Limits
from sidecar.status import LeaderStatus
from tests.support.clock import run_alone
from tests.unit.test_api import TIMING, client_for, make_elector

WAITERS = 100
LIMITS = Limits(max_long_polls=WAITERS)


def count_status_calls(elector: Elector) -> list[int]:
    calls = [0]
    real = elector.status

    def counted() -> LeaderStatus:
        calls[0] += 1
        return real()

    elector.status = counted  # type: ignore[method-assign]
    return calls


async def test_idle_long_polls_on_the_leader_sleep_through_renewals() -> None:
    elector = make_elector(MemoryLeaseState(), "a")
    await elector.step()
    running = asyncio.create_task(run_alone(elector))
    try:
        async with await client_for(create_local_app(elector, LIMITS)) as client:
            etag = (await client.get("/leader")).headers["ETag"]
            term = elector.status().term
            polls = [
                asyncio.create_task(
                    client.get("/leader", params={"wait": "30"}, headers={"If-None-Match": etag})
                )
                for _ in range(WAITERS)
            ]
            await asyncio.sleep(0.3)  # every poll is parked
            calls = count_status_calls(elector)
            await asyncio.sleep(TIMING.lease_duration * 2)  # six renewals
            assert elector.status().term == term
            assert elector.is_leader()
            # Before: each waiter woke at its old deadline, after every lease or so, to find
            # the deadline moved (~2 reads per waiter here). Now only the one follower task
            # does, and the elector itself at each renewal; the waiters sleep.
            assert calls[0] < WAITERS // 4, f"{calls[0]} state reads by {WAITERS} idle waiters"
            assert not any(poll.done() for poll in polls)
            for poll in polls:
                poll.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_every_waiter_wakes_when_the_answer_changes() -> None:
    state = MemoryLeaseState()
    elector = make_elector(state, "a")
    await elector.step()
    async with await client_for(create_local_app(elector, LIMITS)) as client:
        etag = (await client.get("/leader")).headers["ETag"]
        polls = [
            asyncio.create_task(
                client.get("/leader", params={"wait": "30"}, headers={"If-None-Match": etag})
            )
            for _ in range(WAITERS)
        ]
        await asyncio.sleep(0.2)
        await elector.release()
        answers = await asyncio.wait_for(asyncio.gather(*polls), 5)
        assert [answer.status for answer in answers] == [503] * WAITERS
        assert {answer.headers["ETag"] for answer in answers} != {etag}
