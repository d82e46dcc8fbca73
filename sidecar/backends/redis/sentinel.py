"""Following the Sentinels: their ``+switch-master`` announcements move the store to a new
master within moments, instead of when the old one finally refuses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sidecar.logs import log

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.sentinel import Sentinel

logger = logging.getLogger("sidecar.redis")

SWITCH_MASTER = "+switch-master"


async def follow_sentinels(
    sentinel: Sentinel,
    master_name: str | None,
    on_switch: Callable[[str], Awaitable[None]],
    *,
    request_timeout: float,
    backoff: tuple[float, float],
) -> None:
    """Listen to every Sentinel's ``+switch-master`` for our master name; call ``on_switch``
    with each announcement. Runs until cancelled."""
    await asyncio.gather(
        *(
            _follow_sentinel(s, master_name, on_switch, request_timeout, backoff)
            for s in sentinel.sentinels
        )
    )


async def _follow_sentinel(
    sentinel: Redis,
    master_name: str | None,
    on_switch: Callable[[str], Awaitable[None]],
    request_timeout: float,
    backoff: tuple[float, float],
) -> None:
    delay = backoff[0]
    while True:
        pubsub = sentinel.pubsub()
        try:
            await asyncio.wait_for(pubsub.subscribe(SWITCH_MASTER), request_timeout)
            delay = backoff[0]
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                # "<master name> <old ip> <old port> <new ip> <new port>"
                name, *_rest = str(message["data"]).split()
                if name == master_name:
                    await on_switch(str(message["data"]))
        except Exception as exc:  # keep following; requests still rediscover on errors
            log(logger, "debug", "sentinel subscription lost", error=str(exc))
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, backoff[1])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]
