"""`RedisStoreClient`: the leases and candidate groups of one Redis, and their renewals in one
script, on the pool, pub/sub hub, Sentinels and epoch of a `connection.RedisConnection`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from sidecar.backends.base import NotOwned, Renewal, RenewalOutcome, StoreError
from sidecar.backends.kit.versions import new_version
from sidecar.backends.redis.candidates import RedisCandidates
from sidecar.backends.redis.connection import RedisConnection, ms
from sidecar.backends.redis.scripts import lease_keys
from sidecar.backends.redis.store import RedisLease
from sidecar.backends.redis.target import RedisTarget
from sidecar.clock import SYSTEM_CLOCK, Clock


class RedisStoreClient(RedisConnection):
    """The `StoreClient` of one Redis."""

    def lease(self, name: str) -> RedisLease:
        return RedisLease(self, name)

    def candidates(self, group: str) -> RedisCandidates:
        return RedisCandidates(self, group)

    async def renew_many(self, renewals: Sequence[Renewal]) -> list[RenewalOutcome]:
        """`RenewsMany`: one script renews every lease (`scripts.RENEW_MANY`), then, with
        ``min_replicas``, one ``WAIT`` for all of them — too few replicas and none counts."""
        if not renewals:
            return []
        wall = self.clock.wall().isoformat()
        keys: list[str] = []
        args: list[str | int] = [wall, len(renewals)]
        for r in renewals:
            holder_key, term_key, channel = lease_keys(r.name)
            keys += [holder_key, term_key]
            args += [
                r.identity, r.term, ms(r.duration), channel, new_version(),
                ms(max(RedisLease.GC_MIN, RedisLease.GC_LEASES * r.duration)),
            ]  # fmt: skip

        async def work() -> list[RenewalOutcome]:
            async with self.borrowed() as conn:
                generation = self.master_generation
                reply = await self.renew_many_script(keys=keys, args=args, client=conn)
                self.check_same_master(generation)
                if self.min_replicas:
                    await self._confirm_batch(conn, len(renewals))
            return [self._outcome(r, reply[3 * i : 3 * i + 3]) for i, r in enumerate(renewals)]

        return await self.guarded(work, "the leases' holder keys")

    def _outcome(self, renewal: Renewal, reply: list[Any]) -> RenewalOutcome:
        record = self.record_in(renewal.name, reply)
        if isinstance(record, StoreError):
            return record
        if int(reply[0]) == 1:
            assert record is not None
            return record
        return NotOwned(f"not held by {renewal.identity} with term {renewal.term}", record)

    async def _confirm_batch(self, conn: Redis, count: int) -> None:
        """``WAIT min_replicas`` after a batch of renewals: as for one renewal, too few
        acknowledgements and none of them counts (fail closed)."""
        acked = int(await conn.wait(self.min_replicas, max(1, ms(self.wait_timeout))))
        if acked < self.min_replicas:
            raise self.fail(
                "warning",
                f"only {acked} of {self.min_replicas} replica(s) acknowledged a batch of {count} "
                f"renewal(s) within {self.wait_timeout:g}s (--redis-min-replicas); they do not "
                "count",
                kind="too few replicas acknowledged",
            )


class RedisLeaseStore(RedisLease):
    """One lease on a client of its own, built from a target: the single-lease store that
    `open_redis_store`, the tests, the chaos suite and the benchmarks construct. Closing it
    closes that client."""

    def __init__(
        self,
        target: RedisTarget,
        lease: str,
        *,
        request_timeout: float = 2.0,
        min_replicas: int = 0,
        wait_timeout: float | None = None,
        client_name: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        client = RedisStoreClient(
            target,
            request_timeout=request_timeout,
            min_replicas=min_replicas,
            wait_timeout=wait_timeout,
            client_name=client_name,
            clock=clock,
        )
        super().__init__(client, lease)

    async def close(self) -> None:
        await self.client.close()
