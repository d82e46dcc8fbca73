"""The one guard around every request the election sends a store: a lease's own calls
(`sidecar.elector`) and every renewal, alone or in a batch (`sidecar.renewal`).

A request gets a budget of seconds and is counted once, by outcome, in
``store_requests_total{op,outcome}``. It fails closed: a timeout or an error the store did not
mean (a bug in a driver) becomes `StoreUnavailable` — nothing is known — and never crashes the
caller's loop. What the store *answered*, a grant refused or a lease not ours, passes through as
the store raised it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sidecar.backends.base import Conflict, LeaseHeld, NotOwned, StoreError, StoreUnavailable
from sidecar.clock import Clock

T = TypeVar("T")
logger = logging.getLogger("sidecar.store_call")

Count = Callable[[str, str, float], None]
"""Where a request is counted: ``count(op, outcome, seconds)`` (`Metrics.store_request`)."""

ANSWERS = (LeaseHeld, NotOwned, Conflict)
"""What a store answers by raising: it answered, and what it holds is not the caller's."""

_OUTCOMES: tuple[tuple[type[StoreError], str], ...] = (
    (LeaseHeld, "held"),
    (NotOwned, "not_owned"),
    (Conflict, "conflict"),
    (StoreUnavailable, "unavailable"),
)


def outcome_of(error: StoreError) -> str:
    """The outcome a store's own error is counted under."""
    for kind, outcome in _OUTCOMES:
        if isinstance(error, kind):
            return outcome
    return "error"


async def store_call(
    op: str,
    request: Callable[[], Awaitable[T]],
    budget: float,
    *,
    clock: Clock,
    count: Count,
    answered_as: Callable[[T], str] | None = None,
) -> T:
    """``request()`` within ``budget`` seconds, counted as ``op`` by its outcome
    (``answered_as(answer)`` names the outcome of an answer; "ok" without it). Raises what
    the store raised (`LeaseHeld`, `NotOwned`, `Conflict`, `StoreUnavailable`), or
    `StoreUnavailable` for a timeout or an unexpected error."""
    started = clock.now()
    outcome = "ok"
    try:
        async with asyncio.timeout(max(budget, 0.001)):
            answer = await request()
        if answered_as is not None:
            outcome = answered_as(answer)
        return answer
    except TimeoutError:
        outcome = "timeout"
        raise StoreUnavailable(f"{op} timed out after {budget:.3f}s") from None
    except (*ANSWERS, StoreUnavailable) as exc:
        outcome = outcome_of(exc)
        raise
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except Exception as exc:
        outcome = "error"
        logger.exception("unexpected store error", extra={"sidecar_fields": {"op": op}})
        raise StoreUnavailable(f"{op}: {type(exc).__name__}: {exc}") from exc
    finally:
        count(op, outcome, clock.now() - started)
