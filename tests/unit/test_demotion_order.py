"""A step down on purpose tells the app first, and the actions that talk to the API server
(the pod label, the Event) only once the store answered the release: sent beside the
hand-over, they competed with it at the API server and held the hand-off up by a few ms."""

from __future__ import annotations

import asyncio

from sidecar.demotion import ActionRunner
from sidecar.status import LeaderStatus, Role, Transition
from tests.unit.test_elector import World, store_of, world  # noqa: F401


def status(leader: bool) -> LeaderStatus:
    return LeaderStatus(leader, "a_0000", "a_0000", 1, "unit", 10.0, 0.0, None)


class Recording:
    def __init__(self, name: str, after_release: bool, seen: list[tuple[str, bool | None]]):
        self.name = name
        self.after_release = after_release
        self.seen = seen

    async def __call__(self, transition: Transition) -> None:
        settled = transition.settled.is_set() if transition.settled is not None else None
        self.seen.append((self.name, settled))


async def test_a_step_down_on_purpose_runs_the_apps_actions_first_and_the_api_after() -> None:
    seen: list[tuple[str, bool | None]] = []
    runner = ActionRunner(
        [Recording("label", True, seen), Recording("webhook", False, seen)]  # type: ignore[list-item]
    )
    running = asyncio.create_task(runner.run())
    try:
        settled = asyncio.Event()
        runner.submit(Transition(Role.FOLLOWER, "shutdown", status(False), None, settled))
        await asyncio.sleep(0.05)
        assert seen == [("webhook", False)]  # the label waits for the release's answer
        settled.set()
        assert await runner.drain(1.0)
        assert seen == [("webhook", False), ("label", True)]
        # Any other transition keeps the configured order, and nothing waits.
        seen.clear()
        runner.submit(Transition(Role.FOLLOWER, "deadline", status(False), None))
        assert await runner.drain(1.0)
        assert seen == [("label", None), ("webhook", None)]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_slow_webhook_does_not_hold_the_label_up_once_the_release_answered() -> None:
    seen: list[tuple[str, bool | None]] = []

    class SlowApp(Recording):
        async def __call__(self, transition: Transition) -> None:
            await asyncio.sleep(0.5)
            await super().__call__(transition)

    runner = ActionRunner(
        [Recording("label", True, seen), SlowApp("webhook", False, seen)]  # type: ignore[list-item]
    )
    running = asyncio.create_task(runner.run())
    try:
        settled = asyncio.Event()
        settled.set()
        runner.submit(Transition(Role.FOLLOWER, "shutdown", status(False), None, settled))
        await asyncio.sleep(0.1)
        assert seen == [("label", True)]
        assert await runner.drain(2.0)
        assert seen == [("label", True), ("webhook", True)]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_release_marks_the_step_down_settled_once_the_store_answered(
    world: World,  # noqa: F811
) -> None:
    a = world.elector("a")
    heard: list[Transition] = []
    a.on_transition(heard.append)
    await a.step()
    during: list[bool] = []
    store_of(a).during["hand_over"] = lambda: during.append(heard[-1].settled.is_set())  # type: ignore[union-attr]
    assert await a.release(successor="b_0000", handed="7")
    stepped_down = heard[-1]
    assert (stepped_down.role, stepped_down.reason) == (Role.FOLLOWER, "released")
    assert during == [False]
    assert stepped_down.settled is not None
    assert stepped_down.settled.is_set()
