"""How long a lease waits before its next step, where no answer of the store says when: a
follower until its view allows an attempt, a retry period after a failure, a leader's retry
within its deadline (rule 3), and a follower that waits for the sidecar's store probe instead
of sending requests of its own (`sidecar.probe`). Jitter spreads only what would collide.
"""

from __future__ import annotations

import random

from sidecar.backends.base import StoreError, StoreUnavailable
from sidecar.observed import LeaseView
from sidecar.probe import StoreProbe
from sidecar.timing import Timing


def herd_jitter(timing: Timing, rng: random.Random) -> float:
    """A little spread so followers woken together do not all hit the store at once."""
    return rng.uniform(0, min(0.1 * timing.retry_period, 0.05))


def retry_delay(timing: Timing, rng: random.Random) -> float:
    return timing.retry_period * rng.uniform(1.0, 1.5)


def follower_delay(
    view: LeaseView, now: float, timing: Timing, rng: random.Random, *, raced: bool = False
) -> float:
    """Until the next attempt the view allows: at the exact observed expiry, or at once for
    a release, a new lease or our own name — a hand-off is one notification plus one round
    trip. Jitter only where followers would collide again: after a lost race, and at an
    expiry they all timed from the same renewal."""
    attempt = view.next_attempt(now)
    wait = max(0.0, attempt.at - now)
    if wait > 0 or raced:
        return wait + herd_jitter(timing, rng)
    return 0.0


def renewal_retry(
    now: float, valid_until: float, failed: StoreError, timing: Timing, rng: random.Random
) -> tuple[float, float]:
    """When a leader whose renewal failed tries again: a retry period on, or later if the
    store asked (``Retry-After``) — but only while its deadline allows one more request
    before it (rule 3). Never past the deadline. Returns the delay, and the moment before
    which nothing may bring the retry forward (the store's ``Retry-After``; -inf: none)."""
    room = valid_until - now
    last_chance = room - timing.request_timeout
    delay = retry_delay(timing, rng)
    retry_after = failed.retry_after if isinstance(failed, StoreUnavailable) else None
    not_before = float("-inf")
    if retry_after is not None:
        delay = max(delay, min(retry_after, last_chance))
        not_before = now + min(retry_after, last_chance)
    elif last_chance > 0:
        # A retry period may end past the deadline; the last moment a whole request still
        # fits before it comes first (a store back by then keeps the term). Only once: by
        # then no whole request fits any more.
        delay = min(delay, last_chance)
    return min(delay, room), not_before


def probe_wait(probe: StoreProbe | None, now: float) -> float | None:
    """None when a follower may send now; else seconds to wait: for the store's
    ``Retry-After``, or (``inf``) until the probe finds the store answering again."""
    if probe is None:
        return None
    if probe.refusing:
        return float("inf")
    wait = probe.wait_after(now)
    return wait if wait > 0 else None
