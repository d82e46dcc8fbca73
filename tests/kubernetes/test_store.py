"""The Kubernetes lease store against the fake API server, through the sidecar's client: the
Lease's fields, what a candidate times observed expiry by (resourceVersion and duration,
never renewTime), a deleted Lease put back by its holder, compare-and-swap without blind
retries, failures as StoreUnavailable within the request timeout, and the number of API
calls each step costs."""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from typing import Any

import aiohttp
import pytest

import sidecar
from sidecar.backends.base import Conflict, LeaseHeld, NotOwned, StoreUnavailable
from sidecar.backends.kubernetes.store import whole_seconds
from sidecar.observed import LeaseView
from tests.fakekube import FakeApiServer
from tests.fakekube.wire import LEASES
from tests.kubernetes.conftest import LEASE, NAMESPACE, StoreFactory
from tests.support.clock import FakeClock


def lease_spec(fake: FakeApiServer) -> dict[str, Any] | None:
    lease = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    return None if lease is None else dict(lease["spec"])


def calls(fake: FakeApiServer) -> list[tuple[str, int]]:
    return [(r["verb"], r["status"]) for r in fake.requests if r["resource"] == "leases"]


async def put_foreign_lease(fake: FakeApiServer, spec: dict[str, Any]) -> None:
    """A Lease written by someone else (another client, kubectl, a skewed clock)."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE},
        "spec": spec,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{fake.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", json=body
        ) as response,
    ):
        assert response.status == 201, await response.text()


@pytest.mark.parametrize(("seconds", "written"), [(0.5, 1), (1.0, 1), (1.5, 2), (15.0, 15)])
def test_lease_duration_seconds_is_rounded_up_to_whole_seconds(
    seconds: float, written: int
) -> None:
    """An int32 on the wire; rounding up means others never wait less than we hold."""
    assert whole_seconds(seconds) == written


async def test_acquiring_a_missing_lease_creates_it_with_the_standard_fields(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """holderIdentity, leaseDurationSeconds, MicroTimes with six digits (even on a whole
    second, which the client alone would write as ``+00:00`` and be refused), term in
    leaseTransitions; one POST (expecting no record needs no read first)."""
    clock = FakeClock()  # wall clock exactly on a whole second
    store = make_store(clock=clock)
    granted = await store.try_acquire("app-0_aa", 1.5, 0, expected=None)
    assert (granted.holder, granted.term, granted.duration) == ("app-0_aa", 1, 2.0)
    assert lease_spec(fake) == {
        "holderIdentity": "app-0_aa",
        "leaseDurationSeconds": 2,
        "acquireTime": "2026-11-29T09:00:00.000000Z",
        "renewTime": "2026-11-29T09:00:00.000000Z",
        "leaseTransitions": 1,
    }
    assert calls(fake) == [("create", 201)]


async def test_a_renewal_is_one_conditional_patch_that_keeps_the_term(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    granted = await store.try_acquire("app-0_aa", 2, 0, expected=None)
    fake.requests.clear()
    clock.advance(0.654321)
    renewed = await store.renew("app-0_aa", granted.term, 2)
    assert calls(fake) == [("patch", 200)]
    assert renewed.term == granted.term
    assert renewed.version != granted.version
    spec = lease_spec(fake)
    assert spec is not None
    assert spec["renewTime"] == "2026-11-29T09:00:00.654321Z"
    assert spec["acquireTime"] == "2026-11-29T09:00:00.000000Z"
    assert spec["leaseTransitions"] == granted.term


async def test_another_holders_lease_expires_only_after_being_seen_unchanged_for_its_duration(
    make_store: StoreFactory,
) -> None:
    """Observe-based expiry (rule 2), on the candidate's own monotonic clock: the store
    reports the resourceVersion and the duration, the candidate's view times them, and the
    grant is a PUT conditional on the very version it timed."""
    holder = make_store()
    clock = FakeClock()
    candidate = make_store(clock=clock)
    view = LeaseView("b_1", 2.0)
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    with pytest.raises((LeaseHeld, Conflict)) as held:  # it exists: nothing is not expected
        await candidate.try_acquire("b_1", 2, 0, expected=None)
    seen = held.value.record
    assert seen is not None
    assert (seen.holder, seen.version, seen.duration) == ("a_1", granted.version, 2.0)
    view.observe(seen, clock.now())
    attempt = view.next_attempt(clock.now())
    assert (attempt.at - clock.now(), attempt.expected, attempt.why) == (
        2.0,  # first sight: a whole lease to wait
        granted.version,
        "expired",
    )
    clock.advance(1.9)
    view.observe(await candidate.read(), clock.now())
    assert view.next_attempt(clock.now()).at - clock.now() == pytest.approx(0.1)
    clock.advance(0.1)
    attempt = view.next_attempt(clock.now())
    assert attempt.at <= clock.now()
    taken = await candidate.try_acquire("b_1", 2, attempt.min_term, expected=attempt.expected)
    assert (taken.holder, taken.term) == ("b_1", 2)


async def test_renew_time_is_never_trusted_for_expiry(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """A lease whose renewTime is years old (a holder with a skewed clock) is still a whole
    lease away from expiry for a candidate that has just seen it."""
    await put_foreign_lease(
        fake,
        {
            "holderIdentity": "skewed_1",
            "leaseDurationSeconds": 2,
            "leaseTransitions": 4,
            "renewTime": "2020-01-01T00:00:00.000000Z",
        },
    )
    clock = FakeClock()
    candidate = make_store(clock=clock)
    record = await candidate.read()
    assert record is not None
    assert record.renewed_at is not None
    assert record.renewed_at.year == 2020  # reported, for humans
    assert (record.holder, record.term, record.free) == ("skewed_1", 4, False)
    view = LeaseView("b_1", 2.0)
    view.observe(record, clock.now())
    assert view.next_attempt(clock.now()).at - clock.now() == 2.0
    with pytest.raises((LeaseHeld, Conflict)):
        await candidate.try_acquire("b_1", 2, 0, expected=None)


async def test_a_renewal_seen_by_a_candidate_restarts_its_wait(make_store: StoreFactory) -> None:
    """Every renewal is a new resourceVersion: the candidate's count starts again from it, and
    a grant naming the version it timed before is refused."""
    holder = make_store()
    clock = FakeClock()
    candidate = make_store(clock=clock)
    view = LeaseView("b_1", 2.0)
    granted = await holder.try_acquire("a_1", 2, 0, expected=None)
    view.observe(await candidate.read(), clock.now())
    clock.advance(1.5)
    renewed = await holder.renew("a_1", granted.term, 2)
    assert renewed.version != granted.version
    clock.advance(1.0)  # 2.5 s since the first sight, but the record changed meanwhile
    with pytest.raises((LeaseHeld, Conflict)) as held:
        await candidate.try_acquire("b_1", 2, 0, expected=granted.version)
    assert held.value.record is not None
    assert (held.value.record.holder, held.value.record.version) == ("a_1", renewed.version)
    view.observe(held.value.record, clock.now())
    assert view.next_attempt(clock.now()).at - clock.now() == 2.0


async def test_a_foreign_lease_without_a_duration_uses_ours(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """``kubectl apply`` of a bare Lease: no leaseDurationSeconds is not 'expired at once'."""
    await put_foreign_lease(fake, {"holderIdentity": "manual_1"})
    clock = FakeClock()
    record = await make_store(clock=clock).read()
    assert record is not None
    assert (record.holder, record.duration, record.free) == ("manual_1", 2.0, False)
    view = LeaseView("b_1", 2.0)
    view.observe(record, clock.now())
    assert view.next_attempt(clock.now()).at - clock.now() == 2.0


async def test_release_empties_the_holder_and_keeps_the_term(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    store = make_store()
    granted = await store.try_acquire("a_1", 2, 5, expected=None)
    released = await store.release("a_1", granted.term)
    assert released is not None
    assert (released.holder, released.term, released.released, released.free) == (
        None,
        6,
        True,
        True,
    )
    spec = lease_spec(fake)
    assert spec is not None
    assert spec["holderIdentity"] == ""
    assert spec["leaseTransitions"] == 6


async def test_releasing_a_deleted_lease_is_not_owned_and_renewing_it_puts_the_grant_back(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """A deleted Lease is a store that lost our grant. A release must not resurrect it (a
    PUT would: create-on-update; the store patches, and gets 404); the holder's renewal does,
    with its own name and term (rule 5), so its term stays used and the others see it."""
    store = make_store()
    granted = await store.try_acquire("a_1", 2, 3, expected=None)
    fake.cluster.delete(LEASES, NAMESPACE, LEASE)
    fake.requests.clear()
    with pytest.raises(NotOwned) as refused:
        await store.release("a_1", granted.term)
    assert refused.value.record is None
    assert lease_spec(fake) is None
    assert calls(fake) == [("patch", 404)]
    restored = await store.renew("a_1", granted.term, 2)
    assert (restored.holder, restored.term) == ("a_1", granted.term)
    spec = lease_spec(fake)
    assert spec is not None
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("a_1", granted.term)
    assert calls(fake)[-1] == ("create", 201)


async def test_a_renewal_never_overwrites_a_later_grant_or_a_release(
    make_store: StoreFactory,
) -> None:
    """Putting a grant back is only for a Lease that lost it (deleted, or an older term):
    a release of our grant, or a grant to someone else, stays as it is."""
    mine, theirs = make_store(), make_store()
    granted = await mine.try_acquire("a_1", 2, 0, expected=None)
    released = await mine.release("a_1", granted.term)
    assert released is not None
    with pytest.raises(NotOwned):
        await mine.renew("a_1", granted.term, 2)
    taken = await theirs.try_acquire("b_1", 2, 0, expected=released.version)
    with pytest.raises(NotOwned):
        await mine.renew("a_1", granted.term, 2)
    current = await theirs.read()
    assert current is not None
    assert (current.holder, current.term, current.version) == ("b_1", taken.term, taken.version)


async def test_a_lost_race_is_read_again_and_reported_never_retried(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """409 on the compare-and-swap: one re-read, Conflict with the fresh record, no 2nd PUT."""
    first = make_store()
    granted = await first.try_acquire("a_1", 30, 0, expected=None)
    released = await first.release("a_1", granted.term)
    assert released is not None
    fake.faults = fake.faults.parse(
        {"errors": [{"status": 409, "count": 1, "match": {"verbs": ["update"]}}]}
    )
    second = make_store()
    fake.requests.clear()
    with pytest.raises(Conflict) as lost:
        await second.try_acquire("b_1", 30, 0, expected=released.version)
    assert calls(fake) == [("get", 200), ("update", 409), ("get", 200)]
    assert lost.value.record is not None
    assert lost.value.record.term == granted.term


async def test_a_renewal_conflict_is_a_conflict_while_the_lease_is_still_ours(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    store = make_store()
    granted = await store.try_acquire("a_1", 30, 0, expected=None)
    fake.faults = fake.faults.parse(
        {"errors": [{"status": 409, "count": 1, "match": {"verbs": ["patch"]}}]}
    )
    with pytest.raises(Conflict) as busy:
        await store.renew("a_1", granted.term, 30)
    assert busy.value.record is not None
    assert busy.value.record.holder == "a_1"
    renewed = await store.renew("a_1", granted.term, 30)  # the re-read gave the fresh version
    assert renewed.term == granted.term


async def test_a_renewal_conflict_that_cannot_be_read_again_is_no_reason_to_give_up(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """409, then the re-read fails: nothing is known, so Conflict (tolerated until the
    deadline), not NotOwned (which would demote at once)."""
    store = make_store()
    granted = await store.try_acquire("a_1", 30, 0, expected=None)
    fake.faults = fake.faults.parse(
        {
            "errors": [
                {"status": 409, "count": 1, "match": {"verbs": ["patch"]}},
                {"status": 500, "count": 1, "match": {"verbs": ["get"]}},
            ]
        }
    )
    with pytest.raises(Conflict) as unknown:
        await store.renew("a_1", granted.term, 30)
    assert unknown.value.record is None


async def test_a_renewal_after_someone_else_took_the_lease_is_not_owned(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """The old holder's patch carries the resourceVersion it last saw: 409, one re-read,
    NotOwned with the new holder's record; nothing is overwritten."""
    mine, theirs = make_store(), make_store()
    granted = await mine.try_acquire("a_1", 2, 0, expected=None)
    watched = await theirs.read()  # the version a follower watched unchanged for a lease
    assert watched is not None
    taken = await theirs.try_acquire("b_1", 2, 0, expected=watched.version)
    assert (taken.holder, taken.term) == ("b_1", granted.term + 1)
    fake.requests.clear()
    with pytest.raises(NotOwned) as refused:
        await mine.renew("a_1", granted.term, 2)
    assert calls(fake) == [("patch", 409), ("get", 200)]
    assert refused.value.record is not None
    assert (refused.value.record.holder, refused.value.record.term) == ("b_1", taken.term)
    spec = lease_spec(fake)
    assert spec is not None
    assert spec["holderIdentity"] == "b_1"


@pytest.mark.parametrize("code", [500, 503, 429, 504])
async def test_server_errors_are_store_unavailable(
    fake: FakeApiServer, make_store: StoreFactory, code: int
) -> None:
    store = make_store()
    fake.faults = fake.faults.parse({"errors": [{"status": code}]})
    for call in (
        store.read,
        lambda: store.try_acquire("a_1", 2, 0, expected=None),
        lambda: store.try_acquire("a_1", 2, 0, expected="1"),
    ):
        with pytest.raises(StoreUnavailable, match=f"HTTP {code}"):
            await call()


async def test_a_stalled_api_answers_unavailable_within_the_request_timeout(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    store = make_store(request_timeout=0.3)
    granted = await store.try_acquire("a_1", 2, 0, expected=None)
    fake.faults = fake.faults.parse({"latency": 5})
    for call in (
        store.read,
        lambda: store.try_acquire("b_1", 2, 0, expected=None),
        lambda: store.try_acquire("b_1", 2, 0, expected=granted.version),
        lambda: store.renew("a_1", granted.term, 2),
        lambda: store.release("a_1", granted.term),
    ):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no answer"):
            await call()
        assert time.monotonic() - started < 0.8


async def test_a_partitioned_api_is_unavailable_at_once(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    store = make_store()
    granted = await store.try_acquire("a_1", 2, 0, expected=None)
    await fake.partition()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no answer"):
        await store.renew("a_1", granted.term, 2)
    assert time.monotonic() - started < 1.0
    await fake.heal()
    renewed = await store.renew("a_1", granted.term, 2)
    assert renewed.term == granted.term


async def test_a_refusal_by_rbac_is_unavailable_and_logged_with_the_fix(
    fake: FakeApiServer, make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = make_store()
    fake.faults = fake.faults.parse({"forbid": [{"resources": ["leases"]}]})
    with (
        caplog.at_level(logging.ERROR, logger="sidecar.kubernetes"),
        pytest.raises(StoreUnavailable, match="HTTP 403 Forbidden"),
    ):
        await store.try_acquire("a_1", 2, 0, expected=None)
    refusals = [r for r in caplog.records if "RBAC" in r.getMessage()]
    assert len(refusals) == 1
    fields = refusals[0].sidecar_fields  # type: ignore[attr-defined]
    assert 'cannot create resource "leases"' in fields["error"]  # nothing expected: a POST
    assert "leases get/list/watch/create/update/patch" in fields["fix"]


async def test_a_missing_namespace_is_unavailable_and_names_the_fix(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    fake.cluster.namespaces.discard(NAMESPACE)
    with pytest.raises(StoreUnavailable, match="create namespace demo or fix --namespace"):
        await make_store().try_acquire("a_1", 2, 0, expected=None)


async def test_the_requests_carry_our_user_agent_and_timeout(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """So the server's managedFields and audit log name the sidecar and its version, and the
    server stops working on a request once the client's timeout has passed (client-go sends
    ``?timeout=`` too)."""
    await make_store(request_timeout=2.5).try_acquire("a_1", 2, 0, expected=None)
    assert {r["user_agent"] for r in fake.requests} == {
        f"leader-sidecar/{sidecar.__version__} ({platform.system().lower()}/"
        f"{platform.machine()}) python/{platform.python_version()} aiohttp/{aiohttp.__version__}"
    }
    assert {r["timeout"] for r in fake.requests} == {"2500ms"}
    lease = fake.cluster.get(LEASES, NAMESPACE, LEASE)
    assert lease is not None
    assert lease["metadata"]["managedFields"][0]["manager"] == "leader-sidecar"


async def test_concurrent_candidates_on_a_released_lease_yield_one_grant(
    make_store: StoreFactory,
) -> None:
    """The PUT compare-and-swap: of ten candidates racing for a free lease, one wins."""
    first = make_store()
    granted = await first.try_acquire("a_1", 30, 0, expected=None)
    released = await first.release("a_1", granted.term)
    assert released is not None
    stores = [make_store() for _ in range(10)]

    async def attempt(index: int) -> str | None:
        try:
            store = stores[index]
            return (await store.try_acquire(f"c{index}_1", 30, 0, expected=released.version)).holder
        except (Conflict, LeaseHeld):  # lost the race, or read after the winner's write
            return None

    results = await asyncio.gather(*(attempt(i) for i in range(10)))
    winners = [holder for holder in results if holder]
    assert len(winners) == 1
    current = await first.read()
    assert current is not None
    assert (current.holder, current.term) == (winners[0], granted.term + 1)


async def test_a_lower_resource_version_is_reported_as_it_came(make_store: StoreFactory) -> None:
    """After the API server's storage is wiped, resourceVersions start again: a Lease with a
    lower one is the store as it is now — a loss the elector must see — not a late event to
    hide behind the record seen before. (Hiding it let a chaos run's replica miss a loss,
    count one fewer, and jump to the very term another had been granted.)"""
    store = make_store()
    before = {
        "metadata": {"name": LEASE, "namespace": NAMESPACE, "resourceVersion": "500", "uid": "u1"},
        "spec": {"holderIdentity": "a_1", "leaseTransitions": 3003, "leaseDurationSeconds": 1},
    }
    after = {
        "metadata": {"name": LEASE, "namespace": NAMESPACE, "resourceVersion": "3", "uid": "u2"},
        "spec": {"holderIdentity": "b_1", "leaseTransitions": 2, "leaseDurationSeconds": 1},
    }
    assert store._observe(before) is not None
    record = store._observe(after)
    assert record is not None
    assert (record.holder, record.term) == ("b_1", 2)
    view = LeaseView("c_1", 1.0)
    view.observe(store._observe(before), at=0.0)
    assert view.observe(store._observe(after), at=0.1)  # a loss


# -- issue 25: what a hand or another program wrote ---------------------------------------------


async def test_the_api_server_refuses_a_term_past_int32(fake: FakeApiServer) -> None:
    """As the real one does (``cannot unmarshal number … of type int32``): a Lease cannot
    hold a term past 2^31 - 1, whoever writes it."""
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE},
        "spec": {"holderIdentity": "x_1", "leaseTransitions": 2**31},
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{fake.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", json=body
        ) as response,
    ):
        assert response.status == 400
        assert "of type int32" in await response.text()


async def test_a_lease_written_with_control_characters_is_unknown_and_taken_over_its_version(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """A holder the sidecar could never have written (an escape sequence, a forged line):
    a record of unknown holder, taken only over its resourceVersion, above its term."""
    await put_foreign_lease(
        fake,
        {"holderIdentity": "x\x1b[2J\r\nforged", "leaseDurationSeconds": 5, "leaseTransitions": 5},
    )
    store = make_store()
    found = await store.read()
    assert found is not None
    assert found.unreadable is not None
    assert "control characters" in found.unreadable
    assert (found.holder, found.term) == (None, 0)
    with pytest.raises(Conflict):  # a create over a Lease that is there
        await store.try_acquire("a_1", 2, 0, expected=None)
    taken = await store.try_acquire("a_1", 2, 0, expected=found.version)
    assert (taken.holder, taken.term, taken.unreadable) == ("a_1", 6, None)


async def test_no_term_past_int32_is_ever_sent(
    fake: FakeApiServer, make_store: StoreFactory
) -> None:
    """A released Lease at 2^31 - 1 (or a floor above it): the next grant cannot be written.
    The store refuses before any request and says what to do."""
    from sidecar.backends.base import TermExhausted

    await put_foreign_lease(fake, {"holderIdentity": "", "leaseTransitions": 2**31 - 1})
    store = make_store()
    found = await store.read()
    assert found is not None
    assert (found.free, found.term) == (True, 2**31 - 1)
    before = len(calls(fake))
    with pytest.raises(TermExhausted, match="refusing to grant term 2147483648"):
        await store.try_acquire("a_1", 2, found.term, expected=found.version)
    with pytest.raises(TermExhausted):
        await store.try_acquire("a_1", 2, 2**31 - 1, expected=None)
    assert len(calls(fake)) == before  # nothing was sent
    assert lease_spec(fake) == {"holderIdentity": "", "leaseTransitions": 2**31 - 1}
