"""Runs every contract test against every store that registered a harness."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.harness import StoreHarness, StoreHarnessFactory

HARNESSES: dict[str, StoreHarnessFactory] = {
    path.stem.removeprefix("harness_"): importlib.import_module(
        f"tests.contract.{path.stem}"
    ).HARNESS
    for path in sorted(Path(__file__).parent.glob("harness_*.py"))
}


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[StoreHarness]:
    async with HARNESSES[request.param]() as harness:
        yield harness
