"""The in-memory store behind a switch: it counts every request (as client-go's tests count
API calls) and, while switched to refusing, answers each with `StoreUnavailable` (with the
``Retry-After`` the test sets) — a store that is down, for tests that count what a sidecar
sends to it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from sidecar.backends.base import (
    Candidate,
    LeaseRecord,
    Renewal,
    RenewalOutcome,
    StoreUnavailable,
)
from sidecar.backends.memory import (
    MemoryCandidates,
    MemoryLeaseStore,
    MemoryServer,
    MemoryStoreClient,
)


class Switch:
    """Shared by every client of one test's store."""

    def __init__(self) -> None:
        self.refusing = False
        self.retry_after: float | None = None
        self.requests: list[tuple[float, str]] = []  # (time.monotonic(), op), every request
        # Per lease, the names of the leases that answer `StoreUnavailable` even while the
        # store as a whole answers (a partial failure).
        self.broken: set[str] = set()

    def enter(self, op: str, lease: str | None = None) -> None:
        self.requests.append((time.monotonic(), op))
        if self.refusing or (lease is not None and lease in self.broken):
            raise StoreUnavailable(f"refused {op}", retry_after=self.retry_after)

    def since(self, moment: float) -> Counter[str]:
        """Requests by op sent from ``moment`` (``time.monotonic()``) on."""
        return Counter(op for at, op in self.requests if at >= moment)


class RefusingLease(MemoryLeaseStore):
    def __init__(self, switch: Switch, server: MemoryServer, name: str) -> None:
        super().__init__(server.state(name), name)
        self.switch = switch

    async def read(self) -> LeaseRecord | None:
        self.switch.enter("read", self.name)
        return await super().read()

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        self.switch.enter("acquire", self.name)
        return await super().try_acquire(identity, duration, min_term, expected=expected)

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        self.switch.enter("renew", self.name)
        return await super().renew(identity, term, duration)

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        self.switch.enter("release", self.name)
        return await super().release(identity, term, successor=successor)

    async def hand_over(
        self,
        identity: str,
        term: int,
        *,
        successor: str,
        handed: str,
        duration: float,
        min_term: int,
    ) -> LeaseRecord:
        self.switch.enter("hand_over", self.name)
        return await super().hand_over(
            identity, term, successor=successor, handed=handed, duration=duration, min_term=min_term
        )

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        self.switch.enter("mark_lost", self.name)
        return await super().mark_lost(term, duration)


class RefusingCandidates(MemoryCandidates):
    def __init__(self, switch: Switch, server: MemoryServer, group: str) -> None:
        super().__init__(server, group)
        self.switch = switch

    async def beat(self, candidate: Candidate, duration: float) -> None:
        self.switch.enter("candidate_beat")
        await super().beat(candidate, duration)

    async def list(self) -> list[Candidate]:
        self.switch.enter("candidate_list")
        return await super().list()

    async def leave(self, identity: str) -> None:
        self.switch.enter("candidate_leave")
        await super().leave(identity)


class RefusingClient(MemoryStoreClient):
    """A `MemoryStoreClient` whose every request goes through ``switch``."""

    def __init__(self, server: MemoryServer, switch: Switch) -> None:
        super().__init__(server)
        self.switch = switch

    def lease(self, name: str) -> RefusingLease:
        return RefusingLease(self.switch, self.server, name)

    def candidates(self, group: str) -> RefusingCandidates:
        return RefusingCandidates(self.switch, self.server, group)

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        if not renewals:
            return []
        self.switch.enter("renew_many")
        outcomes = await super().renew_many(
            [r for r in renewals if r.name not in self.switch.broken]
        )
        answered = iter(outcomes)
        return [
            StoreUnavailable(f"{r.name} is broken")
            if r.name in self.switch.broken
            else next(answered)
            for r in renewals
        ]
