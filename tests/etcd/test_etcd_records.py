"""What a hand or another program put under our etcd keys (issue 25): a value that is not
ours is a record of unknown holder (never an error, never free), taken over only over exactly
that value; a candidate value that is not ours is left out; no term past what the store
holds is written."""

from __future__ import annotations

import json

import pytest

from sidecar.backends.base import Candidate, LeaseHeld, NotOwned, TermExhausted
from sidecar.backends.etcd import EtcdStoreClient, parse_target
from sidecar.backends.etcd.api import b64
from sidecar.backends.records import MAX_TERM
from tests.etcd.cluster import fresh_prefix, shared_cluster

pytestmark = pytest.mark.slow

POISONED = {
    "not-utf8": b"\xff\xfe{",
    "not-json": b"{not json",
    "term-2^63": b'{"holder": "x_1", "term": 9223372036854775807, "duration_ms": 5000, '
    b'"version": "v"}',
    "holder-escape": json.dumps(
        {"holder": "x\u001b[2J", "term": 3, "duration_ms": 5000, "version": "v"}
    ).encode(),
}


async def put(client: EtcdStoreClient, key: bytes, value: bytes) -> None:
    await client.call("put", "/v3/kv/put", {"key": b64(key), "value": b64(value)})


@pytest.mark.parametrize("poison", POISONED, ids=list(POISONED))
async def test_a_poisoned_value_is_unknown_and_taken_over_only_over_exactly_it(
    poison: str,
) -> None:
    client = EtcdStoreClient(parse_target(shared_cluster().url(fresh_prefix("poison"))))
    try:
        lease = client.lease("jobs")
        await put(client, lease.key, POISONED[poison])
        found = await lease.read()
        assert found is not None
        assert found.unreadable is not None
        assert (found.holder, found.term, found.free, found.forgotten) == (None, 0, False, False)
        with pytest.raises(LeaseHeld):
            await lease.try_acquire("a_1", 5.0, 0, expected=None)
        taken = await lease.try_acquire("a_1", 5.0, 1000, expected=found.version)
        assert (taken.holder, taken.term, taken.unreadable) == ("a_1", 1001, None)
        await put(client, lease.key, POISONED[poison])
        with pytest.raises(NotOwned):  # nobody renews or puts back what it cannot read
            await lease.renew("a_1", taken.term, 5.0)
    finally:
        await client.close()


async def test_no_grant_passes_the_highest_term_the_store_holds() -> None:
    client = EtcdStoreClient(parse_target(shared_cluster().url(fresh_prefix("bound"))))
    try:
        lease = client.lease("jobs")
        value = {"holder": None, "term": MAX_TERM, "released": True, "version": "v"}
        await put(client, lease.key, json.dumps(value).encode())
        found = await lease.read()
        assert found is not None
        assert (found.free, found.term) == (True, MAX_TERM)
        with pytest.raises(TermExhausted, match="refusing to grant"):
            await lease.try_acquire("a_1", 5.0, 0, expected=found.version)
        assert await lease.read() == found
    finally:
        await client.close()


async def test_candidate_values_nobody_can_read_are_left_out_not_the_whole_group() -> None:
    client = EtcdStoreClient(parse_target(shared_cluster().url(fresh_prefix("cands"))))
    try:
        group = client.candidates("jobs")
        await group.beat(Candidate("a_1", "11"), 5.0)
        await put(client, group.prefix + b"x_1", b"{not json")
        await put(client, group.prefix + b"y_1", b'{"identity": "y_1", "version": "3", '
                  b'"priority": "abc"}')  # fmt: skip
        await put(client, group.prefix + b"z_1", b'{"identity": "a_1", "version": "9"}')
        found = await group.list()
        assert sorted(c.identity for c in found if c.unreadable is None) == ["a_1"]
        assert len([c for c in found if c.unreadable is not None]) == 3
        await group.beat(Candidate("a_1", "12"), 5.0)
    finally:
        await client.close()
