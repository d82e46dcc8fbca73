"""An in-memory store for elector unit tests: it counts every call, can fail the next ones on
request, and records any call the test did not allow (checked when the test ends)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable

from sidecar.backends.base import LeaseRecord, StoreError
from sidecar.backends.memory import MemoryLeaseState, MemoryLeaseStore

OPS = ("read", "acquire", "renew", "release", "hand_over", "mark_lost")


class StrictStore(MemoryLeaseStore):
    def __init__(self, state: MemoryLeaseState, allowed: set[str] | None = None) -> None:
        super().__init__(state, "unit")
        self.allowed = set(OPS) if allowed is None else allowed
        self.calls: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.failures: dict[str, list[StoreError]] = {op: [] for op in OPS}
        # Runs once the store has done the work, before the answer reaches the caller:
        # a slow answer, or a look at the caller's state while its request is in flight.
        self.during: dict[str, Callable[[], None]] = {}
        self.hands_over_here = True  # False: a store that cannot hand over

    @property
    def hands_over(self) -> bool:
        return self.hands_over_here

    def fail_next(self, op: str, error: StoreError, times: int = 1) -> None:
        self.failures[op].extend([error] * times)

    def fail_always(self, op: str, error: StoreError) -> None:
        self.failures[op] = [error] * 10_000

    def heal(self) -> None:
        for queue in self.failures.values():
            queue.clear()

    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        if op not in self.allowed:
            self.unexpected.append(op)
        if self.failures[op]:
            raise self.failures[op].pop(0)

    def _answer(self, op: str) -> None:
        if op in self.during:
            self.during[op]()

    async def read(self) -> LeaseRecord | None:
        self._enter("read")
        answer = await super().read()
        self._answer("read")
        return answer

    async def try_acquire(
        self, identity: str, duration: float, min_term: int, *, expected: str | None
    ) -> LeaseRecord:
        self._enter("acquire")
        answer = await super().try_acquire(identity, duration, min_term, expected=expected)
        self._answer("acquire")
        return answer

    async def renew(self, identity: str, term: int, duration: float) -> LeaseRecord:
        self._enter("renew")
        answer = await super().renew(identity, term, duration)
        self._answer("renew")
        return answer

    async def release(
        self, identity: str, term: int, *, successor: str | None = None
    ) -> LeaseRecord | None:
        self._enter("release")
        answer = await super().release(identity, term, successor=successor)
        self._answer("release")
        return answer

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
        self._enter("hand_over")
        answer = await super().hand_over(
            identity, term, successor=successor, handed=handed, duration=duration, min_term=min_term
        )
        self._answer("hand_over")
        return answer

    async def mark_lost(self, term: int, duration: float) -> LeaseRecord | None:
        self._enter("mark_lost")
        answer = await super().mark_lost(term, duration)
        self._answer("mark_lost")
        return answer

    async def watch(self) -> AsyncIterator[LeaseRecord | None]:
        async for record in super().watch():
            yield record
