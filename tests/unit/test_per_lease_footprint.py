"""What each lease costs a sidecar in memory (issue 24: 1,000 leases in at most 60 MiB). The
figures are measured by `benchmarks.many_leases`; these tests keep the structure that makes
them: no per-lease instance dict on the elector (``__slots__``: ~1.2 KB a lease), and one
listener object shared by every elector rather than a bound method or closure each."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.app import Sidecar
from sidecar.backends.memory import MemoryStoreClient
from sidecar.config import load
from sidecar.elector import Elector


async def running_sidecar(tmp_path: Path, shards: int) -> Sidecar:
    config = load(
        [
            "--store", f"sqlite:///{tmp_path / 'leases.db'}",
            "--lease", "jobs",
            "--shards", str(shards),
            "--lease-duration", "1s",
            "--listen", "127.0.0.1:0",
            "--public-listen", "127.0.0.1:0",
        ],
        environ={},
    )  # fmt: skip
    sidecar = Sidecar(config, client=MemoryStoreClient())
    await sidecar.start()
    return sidecar


async def test_an_elector_keeps_every_attribute_in_a_slot(tmp_path: Path) -> None:
    """Led, renewed and watched: every attribute an elector set lives in a slot. An attribute
    added without its slot lands in the fallback ``__dict__`` and fails this test."""
    sidecar = await running_sidecar(tmp_path, 4)
    try:
        async with asyncio.timeout(10):
            while len(sidecar.leases.held()) < 4:  # noqa: ASYNC110 (a poll on purpose)
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.6)  # a renewal of each (renew interval 1/3 s)
        electors = list(sidecar.leases.electors.values())
        assert [vars(e) for e in electors] == [{}] * 4
    finally:
        await sidecar.stop()
    assert [vars(e) for e in electors] == [{}] * 4  # stopped too


def test_attributes_not_listed_go_to_a_dict_only_when_set() -> None:
    """The fallback ``__dict__`` exists for tests that patch one elector's method; it costs
    nothing until then."""
    assert "__dict__" in Elector.__slots__
    assert len(Elector.__slots__) == len(set(Elector.__slots__))


async def test_every_elector_shares_its_listeners(tmp_path: Path) -> None:
    """One bound method for all 8 electors, per listener: each elector held 12 bound methods
    and 3 closures of its own (~1 KB a lease)."""
    sidecar = await running_sidecar(tmp_path, 8)
    try:
        electors = list(sidecar.leases.electors.values())
        held_by = {
            "_transition_listeners": lambda e: e._transition_listeners,
            "_change_listeners": lambda e: e._change_listeners,
            "_gaps._listeners": lambda e: e._gaps._listeners,
        }
        for listeners, of in held_by.items():
            firsts = {id(listener) for e in electors for listener in of(e)}
            assert len(firsts) == len(of(electors[0])), listeners
        async with asyncio.timeout(10):
            while len(sidecar.leases.held()) < 8:  # noqa: ASYNC110 (a poll on purpose)
                await asyncio.sleep(0.02)
        assert len({id(e.wake_scheduler) for e in electors}) == 1
    finally:
        await sidecar.stop()
