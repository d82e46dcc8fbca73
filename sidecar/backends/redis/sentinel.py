"""Following the Sentinels: their ``+switch-master`` announcements move the store to a new
master within moments, instead of when the old one finally refuses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sidecar.backends.kit.backoff import Backoff, reconnect_forever
from sidecar.logs import log

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub
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
    waits = Backoff(*backoff)
    pubsubs: list[PubSub] = []  # the one being served

    def opening() -> None:
        pubsubs.append(sentinel.pubsub())

    async def subscribed() -> None:
        pubsub = pubsubs[-1]
        await asyncio.wait_for(pubsub.subscribe(SWITCH_MASTER), request_timeout)
        waits.succeeded()
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            # "<master name> <old ip> <old port> <new ip> <new port>"
            name, *_rest = str(message["data"]).split()
            if name == master_name:
                await on_switch(str(message["data"]))

    def lost(exc: Exception) -> None:  # keep following; requests still rediscover on errors
        log(logger, "debug", "sentinel subscription lost", error=str(exc))

    async def closed() -> None:
        while pubsubs:
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsubs.pop().aclose())  # type: ignore[no-untyped-call]

    await reconnect_forever(subscribed, backoff=waits, failed=lost, opening=opening, closed=closed)
