"""Several PostgreSQL hosts raced: a host that hangs never keeps the sidecar from the others."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.backends.postgresql.hosts import addresses, first_usable
from sidecar.backends.postgresql.target import parse_target


def test_the_urls_hosts_in_order_with_their_ports() -> None:
    target = parse_target("postgresql://u@a:6000,[::1]:6001,c/db")
    assert addresses(target) == [("a", 6000), ("::1", 6001), ("c", 5432)]
    target = parse_target("postgresql://u@/db?host=a,b&port=7000,7001")
    assert addresses(target) == [("a", 7000), ("b", 7001)]
    assert addresses(parse_target("postgresql://u@a,b/db?port=7000")) == [("a", 7000), ("b", 7000)]


class Hosts:
    """Each host answers after its delay, or fails, or hangs; counts the attempts."""

    def __init__(self, **behaviour: float | str) -> None:
        self.behaviour = behaviour
        self.attempts: list[str] = []
        self.closed: list[str] = []

    async def connect(self, host: tuple[str, int]) -> str:
        name = host[0]
        self.attempts.append(name)
        what = self.behaviour[name]
        if what == "hang":
            await asyncio.sleep(3600)
        if what == "refuse":
            raise ConnectionRefusedError(name)
        assert isinstance(what, float)
        await asyncio.sleep(what)
        return name

    async def race(self, stagger: float = 0.05) -> str:
        return await first_usable(
            self.connect,
            [(name, 5432) for name in self.behaviour],
            stagger=stagger,
            close=self.closed.append,
        )


async def test_a_host_that_hangs_gives_way_to_the_next_after_its_head_start() -> None:
    hosts = Hosts(old="hang", new=0.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await hosts.race(stagger=0.05) == "new"
    assert 0.05 <= loop.time() - began < 0.5
    assert hosts.attempts == ["old", "new"]


async def test_a_host_that_answers_in_its_head_start_is_the_only_one_asked() -> None:
    hosts = Hosts(first=0.0, second=0.0)
    assert await hosts.race() == "first"
    assert hosts.attempts == ["first"]


async def test_a_refusal_moves_to_the_next_host_at_once() -> None:
    hosts = Hosts(down="refuse", up=0.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await hosts.race(stagger=10.0) == "up"
    assert loop.time() - began < 1.0


async def test_every_host_failing_raises_the_first_hosts_error() -> None:
    hosts = Hosts(a="refuse", b="refuse")
    with pytest.raises(ConnectionRefusedError, match="a"):
        await hosts.race()


async def test_connections_that_lost_the_race_are_closed() -> None:
    hosts = Hosts(a=0.0, b=0.0, c=0.0)
    assert await hosts.race(stagger=0.0) == "a"
    await asyncio.sleep(0.05)
    assert sorted(hosts.closed) == ["b", "c"][: len(hosts.closed)]
    assert len(hosts.closed) == len(hosts.attempts) - 1


async def test_a_race_given_up_by_its_caller_leaves_no_attempt_running() -> None:
    hosts = Hosts(a="hang", b="hang")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await hosts.race(stagger=0.05)
    await asyncio.sleep(0)
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in tasks if "connect" in repr(t.get_coro())]
