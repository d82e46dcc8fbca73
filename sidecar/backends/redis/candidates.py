"""The candidates of one group in Redis: one hash, ``leader-sidecar:candidates:{GROUP}``, a
field per identity whose value is JSON ``{"version", "revision", "priority", "leaving",
"started_at", "beat_at", "gc_at_ms"}`` (readable with ``redis-cli HGETALL``).

Every beat writes a new random version; readers judge liveness from versions on their own
clock (rule 2). ``beat_at`` and ``gc_at_ms`` are wall time, for humans and for the garbage
collection in the `BEAT` script (20 leases without a beat, at least a minute).

A join, a leave, or a change of what a hand-over chooses by (revision, priority, the leaving
mark) is published on ``leader-sidecar:candidates:{GROUP}:events`` (`changes`), so a leader
that follows the group need not read it again before it hands a lease over."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from typing import Any

from sidecar.backends.base import Candidate
from sidecar.backends.kit import candidate_json
from sidecar.backends.kit.candidate_json import candidate_object
from sidecar.backends.kit.versions import new_version
from sidecar.backends.redis.connection import RedisConnection, ms
from sidecar.backends.redis.scripts import candidates_channel, candidates_key


class RedisCandidates:
    # A record not written for this many leases (at least GC_MIN seconds) is garbage.
    GC_LEASES = 20
    GC_MIN = 60.0

    def __init__(self, client: RedisConnection, group: str) -> None:
        self.client = client
        self.group = group
        self._key = candidates_key(group)
        self._channel = candidates_channel(group)
        self._following = 0  # `changes` running

    async def beat(self, candidate: Candidate, duration: float) -> None:
        await self._beat(candidate, duration, listing=False)

    async def beat_and_list(self, candidate: Candidate, duration: float) -> list[Candidate]:
        """`ListsOnBeat`: one script writes the beat and answers the hash after it."""
        fields = await self._beat(candidate, duration, listing=True)
        # Each checked: a value that is not ours is left out, not the whole group.
        return [
            _candidate(str(fields[i]), str(fields[i + 1])) for i in range(0, len(fields) - 1, 2)
        ]

    async def _beat(self, candidate: Candidate, duration: float, *, listing: bool) -> Any:
        wall = self.client.clock.wall()
        now_ms = ms(wall.timestamp())
        fields = candidate_object(
            candidate, candidate.version or new_version(), wall, with_identity=False
        )
        fields["gc_at_ms"] = now_ms + ms(max(self.GC_MIN, self.GC_LEASES * duration))
        value = candidate_json.encode(fields)

        script = self.client.beat_and_list_script if listing else self.client.beat_script

        async def work() -> Any:
            async with self.client.borrowed() as conn:
                args: list[str | int] = [candidate.identity, value, now_ms, self._channel]
                return await script(keys=[self._key], args=args, client=conn)

        return await self.client.guarded(work, self._key)

    async def list(self) -> list[Candidate]:
        async def work() -> list[Candidate]:
            async with self.client.borrowed() as conn:
                fields = await conn.hgetall(self._key)
            # Each checked: a value that is not ours is left out, not the whole group.
            return [_candidate(str(identity), str(value)) for identity, value in fields.items()]

        return await self.client.guarded(work, self._key)

    async def leave(self, identity: str) -> None:
        async def work() -> None:
            async with self.client.borrowed() as conn:
                args: list[str | int] = [identity, self._channel]
                await self.client.leave_script(keys=[self._key], args=args, client=conn)

        await self.client.guarded(work, self._key)

    async def changes(self) -> AsyncIterator[builtins.list[Candidate] | None]:
        """A notice per message on the group's channel, and per (re)subscription: the hub
        shares its one pub/sub connection with the leases."""
        mailbox = self.client.hub.join(self._channel)
        self._following += 1
        try:
            while True:
                await mailbox.next()
                yield None
        finally:
            self._following -= 1
            self.client.hub.leave(mailbox)

    def following(self) -> bool:
        return self._following > 0 and self.client.hub.subscribed(self._channel)


def _candidate(identity: str, value: str) -> Candidate:
    return candidate_json.decode(identity, value, identity=identity, show_value=True)
