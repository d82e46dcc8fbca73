"""etcd restored from an older snapshot, seen by one client: the store's loss (rules 5, 8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.backends.etcd import EtcdStoreClient, parse_target
from tests.contract.test_contract import LEASE, take
from tests.etcd.cluster import etcd_cluster, fresh_prefix

pytestmark = pytest.mark.slow


async def test_a_replica_that_never_saw_the_forgotten_grant_still_sees_a_loss(
    tmp_path: Path,
) -> None:
    """A follower saw the lease held at term 5, then only etcd's revision move on (other
    keys); meanwhile the lease was released and granted at term 6, then every member was
    restored from a snapshot taken before that. etcd shows the term-5 grant again, which is
    all this follower ever saw of the lease: taken as it is, the follower would wait a lease
    and grant term 6 a second time. Having seen etcd's revision go back, it sees a loss
    instead (a loss marker at term 5: wait a lease, then jump), and the holder of term 6
    puts its grant back over it."""
    with etcd_cluster() as cluster:
        url = cluster.url(fresh_prefix("restore"))
        old, new, follower = (EtcdStoreClient(parse_target(url)) for _ in range(3))
        try:
            first = await take(old.lease("jobs"), "old_1", min_term=4)
            assert first.term == 5
            seen = await follower.lease("jobs").read()
            assert seen is not None
            assert (seen.holder, seen.term) == ("old_1", 5)
            await asyncio.to_thread(cluster.save_snapshot, tmp_path / "snap.db")
            await old.lease("jobs").release("old_1", 5)
            granted = await take(new.lease("jobs"), "new_1")
            assert granted.term == 6
            for i in range(5):  # etcd moves on; the follower sees only that
                await take(new.lease(f"other-{i}"), "new_1")
            await follower.lease("other-4").read()
            await asyncio.to_thread(cluster.restore_snapshot, tmp_path / "snap.db")

            after = await follower.lease("jobs").read()
            assert after is not None
            assert (after.holder, after.term, after.forgotten) == (None, 5, True)
            # The holder of the forgotten grant puts it back; then it shows as it is.
            restored = await new.lease("jobs").renew("new_1", 6, LEASE)
            assert (restored.holder, restored.term) == ("new_1", 6)
            again = await follower.lease("jobs").read()
            assert again is not None
            assert (again.holder, again.term) == ("new_1", 6)
        finally:
            for client in (old, new, follower):
                await client.close()
