"""Waiting for a condition that a blocking call checks, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll a blocking check (e.g. one that talks to the fake API server over HTTP) off the
    event loop until it returns something truthy; fail when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
