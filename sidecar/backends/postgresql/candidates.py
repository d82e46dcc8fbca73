"""The candidate registry of one group, in the ``leader_sidecar.candidates`` table. A trigger
announces joins, leaves and changes of what a hand-over chooses by on the client's one LISTEN
connection, so a leader following its group need not read it before a hand-over."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import asyncpg

from sidecar.backends.base import Candidate
from sidecar.backends.kit.versions import new_version
from sidecar.backends.postgresql import schema

if TYPE_CHECKING:
    from sidecar.backends.postgresql.connection import PostgresConnection

# Records not beaten for this many leases (at least GC_MIN seconds) are deleted by the next
# beat in their group. Wall clock, so only garbage collection: readers judge liveness from
# versions (rule 2).
GC_LEASES = 20
GC_MIN = 60.0


class PostgresCandidates:
    def __init__(self, client: PostgresConnection, group: str) -> None:
        self.client = client
        self.group = group
        self._following = 0  # `changes` running

    async def beat(self, candidate: Candidate, duration: float) -> None:
        now = self.client.clock.wall()
        cutoff = now - timedelta(seconds=max(GC_MIN, GC_LEASES * duration))

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                schema.BEAT, self.group, candidate.identity, candidate.version or new_version(),
                candidate.revision, candidate.priority, candidate.leaving,
                candidate.started_at, now, cutoff,
            )  # fmt: skip

        await self.client.run(work)

    async def list(self) -> builtins.list[Candidate]:
        async def work(connection: asyncpg.Connection) -> Sequence[asyncpg.Record]:
            rows: Sequence[asyncpg.Record] = await connection.fetch(schema.LIST, self.group)
            return rows

        return [schema.candidate(row) for row in await self.client.run(work)]

    async def leave(self, identity: str) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(schema.LEAVE, self.group, identity)

        await self.client.run(work)

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """A notice (read the group) per announcement of the group, and per (re)connection of
        the client's LISTEN session."""
        follower = self.client.hub.follow(self.group)
        self._following += 1
        try:
            while True:
                await follower.ready.wait()
                if follower.ended:
                    return
                follower.ready.clear()
                yield None
        finally:
            self._following -= 1
            self.client.hub.unfollow(follower)

    def following(self) -> bool:
        return self._following > 0 and self.client.hub.connected()
