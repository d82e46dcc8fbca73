"""``leader_sidecar.fence(lease, term)`` in the app's own transaction, against a real server:
it passes only for the newest grant that still holds, a grant of a newer term waits for every
transaction that passed it, and renewals never do."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from sidecar.backends.base import StoreUnavailable
from tests.contract.test_contract import LEASE, take
from tests.postgresql.conftest import ClientFactory, Database

NOT_THE_LEADER = "LS001"


async def fence(connection: asyncpg.Connection, term: int, lease: str = "jobs") -> int:
    value: int = await connection.fetchval("SELECT leader_sidecar.fence($1, $2)", lease, term)
    return value


async def test_the_fence_passes_the_newest_grant_and_refuses_any_other_term(
    database: Database, make_client: ClientFactory
) -> None:
    """Only the term of the newest grant passes; an older or a later term is refused with
    SQLSTATE LS001, and so is a lease never granted."""
    a, b = make_client(database.url).lease("jobs"), make_client(database.url).lease("jobs")
    first = await take(a, "a_1")
    second = await take(b, "b_1")
    connection = await asyncpg.connect(database.url)
    try:
        assert await fence(connection, second.term) == second.term
        for term in (first.term, second.term + 1, 0):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await fence(connection, term)
            assert refused.value.sqlstate == NOT_THE_LEADER
            assert f"term {term}" in str(refused.value)
        with pytest.raises(asyncpg.PostgresError) as never:
            await fence(connection, 1, lease="never-granted")
        assert never.value.sqlstate == NOT_THE_LEADER
    finally:
        await connection.close()


async def test_the_fence_refuses_a_grant_its_holder_released(
    database: Database, make_client: ClientFactory
) -> None:
    """A released grant leads nothing, though no newer grant exists yet."""
    a = make_client(database.url).lease("jobs")
    granted = await take(a, "a_1")
    await a.release("a_1", granted.term)
    connection = await asyncpg.connect(database.url)
    try:
        with pytest.raises(asyncpg.PostgresError, match="released") as refused:
            await fence(connection, granted.term)
        assert refused.value.sqlstate == NOT_THE_LEADER
    finally:
        await connection.close()


async def test_a_newer_grant_waits_until_a_transaction_that_passed_the_fence_ends(
    database: Database, make_client: ClientFactory
) -> None:
    """The share lock: the follower's grant commits only after the app's transaction (which
    passed the fence at the old term) has committed, and that transaction's write is in."""
    holder = make_client(database.url, request_timeout=5.0).lease("jobs")
    follower = make_client(database.url, request_timeout=5.0).lease("jobs")
    granted = await take(holder, "a_1")
    database.sql("CREATE TABLE app_writes (term bigint NOT NULL)")
    app = await asyncpg.connect(database.url)
    try:
        transaction = app.transaction()
        await transaction.start()
        await fence(app, granted.term)
        await app.execute("INSERT INTO app_writes VALUES ($1)", granted.term)
        watched = await follower.read()
        assert watched is not None
        grant = asyncio.create_task(follower.try_acquire("b_1", LEASE, 0, expected=watched.version))
        await asyncio.sleep(0.5)
        assert not grant.done(), "a newer grant committed while a fenced transaction was open"
        committed = time.monotonic()
        await transaction.commit()
        taken = await asyncio.wait_for(grant, 5.0)
        assert time.monotonic() - committed < 2.0
        assert (taken.holder, taken.term) == ("b_1", granted.term + 1)
        # After the grant the old term is refused; the write made under it is kept.
        with pytest.raises(asyncpg.PostgresError):
            await fence(app, granted.term)
        assert database.sql("SELECT count(*) FROM app_writes") == "1"
    finally:
        await app.close()


async def test_a_renewal_never_waits_for_a_transaction_that_passed_the_fence(
    database: Database, make_client: ClientFactory
) -> None:
    """Renewals touch only the lease row, never the grant row the fence locks: a long app
    transaction cannot hold its own leader's renewal back."""
    holder = make_client(database.url, request_timeout=1.0).lease("jobs")
    granted = await take(holder, "a_1")
    app = await asyncpg.connect(database.url)
    try:
        async with app.transaction():
            await fence(app, granted.term)
            for _ in range(3):
                began = time.monotonic()
                renewed = await holder.renew("a_1", granted.term, LEASE)
                assert time.monotonic() - began < 0.5
                assert renewed.term == granted.term
            await fence(app, granted.term)  # still the newest grant
    finally:
        await app.close()


async def test_a_grant_held_back_past_the_request_timeout_is_ended_by_the_server(
    database: Database, make_client: ClientFactory
) -> None:
    """The server's statement timeout ends the waiting grant within the request timeout, so it
    can never commit late; the holder's grant is unchanged and the app's transaction commits."""
    holder = make_client(database.url, request_timeout=2.0).lease("jobs")
    follower = make_client(database.url, request_timeout=0.6).lease("jobs")
    granted = await take(holder, "a_1")
    app = await asyncpg.connect(database.url)
    try:
        async with app.transaction():
            await fence(app, granted.term)
            watched = await follower.read()
            assert watched is not None
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="did not finish within the request"):
                await follower.try_acquire("b_1", LEASE, 0, expected=watched.version)
            assert time.monotonic() - began < 1.0
            await fence(app, granted.term)
        current = await holder.read()
        assert current is not None
        assert (current.holder, current.term) == ("a_1", granted.term)
    finally:
        await app.close()


async def test_a_hand_over_waits_for_the_fenced_transactions_too(
    database: Database, make_client: ClientFactory
) -> None:
    """A hand-over is a grant: the successor's term commits after the app's transaction."""
    holder = make_client(database.url, request_timeout=5.0).lease("jobs")
    granted = await take(holder, "a_1")
    app = await asyncpg.connect(database.url)
    try:
        transaction = app.transaction()
        await transaction.start()
        await fence(app, granted.term)
        handing = asyncio.create_task(
            holder.hand_over(
                "a_1", granted.term, successor="b_1", handed="7", duration=LEASE, min_term=0
            )
        )
        await asyncio.sleep(0.4)
        assert not handing.done()
        await transaction.commit()
        handed = await asyncio.wait_for(handing, 5.0)
        assert (handed.holder, handed.term) == ("b_1", granted.term + 1)
    finally:
        await app.close()
