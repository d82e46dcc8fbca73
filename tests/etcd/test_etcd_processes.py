"""Real ``leader-sidecar`` processes on real three-member etcd clusters, watched every 10 ms
for the whole test by `LeaderObserver` (never two 200s from different replicas at one
instant). Tests that only elect share the session's cluster (a prefix each); tests that hurt
a cluster (kill, pause, take its quorum away, restore a snapshot) start one of their own."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd.cluster import (
    EtcdCluster,
    etcd_cluster,
    etcd_tls_files,
    fresh_prefix,
    shared_cluster,
)
from tests.redis.servers import TlsFiles
from tests.support.sidecars import (
    REPO,
    LeaderObserver,
    SidecarProcess,
    by_name,
    observing,
    sidecars,
    signal_leader,
)

pytestmark = pytest.mark.slow

LEASE = 1.0
RENEW = LEASE / 3
RETRY = min(2.0, RENEW)


def assert_fenced(observer: LeaderObserver) -> None:
    """Every new reign carries a higher term than every earlier one (rule 5)."""
    seen = sorted({(s.since, s.term, s.identity) for s in observer.samples if s.leader and s.term})
    terms = [term for _since, term, _identity in seen]
    assert terms == sorted(terms), seen
    assert len(set(terms)) == len(terms), seen


@pytest.fixture
def own_cluster() -> Iterator[EtcdCluster]:
    with etcd_cluster() as cluster:
        yield cluster


def lease_value(cluster: EtcdCluster, prefix: str, lease: str = "default") -> dict[str, object]:
    out = cluster.etcdctl("get", "--print-value-only", f"{prefix}/lease/{lease}")
    value: dict[str, object] = json.loads(out)
    return value


# -- elections (the shared cluster) -------------------------------------------------------------


async def test_sigkill_of_the_leader_fails_over_to_a_higher_term_within_the_lease() -> None:
    """The dead leader's key stays as it was; a follower that has seen its last version
    unchanged for a lease on its own clock takes it with the next term (no etcd lease, no
    TTL decides it)."""
    cluster = shared_cluster()
    prefix = fresh_prefix("kill")
    with sidecars(["a", "b", "c"], cluster.url(prefix)) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(
                observer, procs, signal.SIGKILL, within=LEASE + RETRY + 0.5 + 2.0
            )
            assert handover.seconds <= LEASE + RETRY + 0.5
            value = lease_value(cluster, prefix)
            assert value["holder"] == handover.successor.identity
            assert value["term"] == handover.successor.term
    observer.assert_never_two_leaders()


async def test_sigterm_of_the_leader_hands_off_in_a_fraction_of_a_second() -> None:
    """The hand-over is one Txn; the successor sees it on its watch and leads on it."""
    cluster = shared_cluster()
    with sidecars(["a", "b", "c"], cluster.url(fresh_prefix("term"))) as procs:
        async with observing(procs) as observer:
            handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
            assert handover.seconds < 0.5
            assert handover.successor.term in ((handover.before.term or 0) + d for d in (1, 2))
            assert handover.leader.wait_exit(2.0) == 0
    observer.assert_never_two_leaders()


async def test_status_reads_the_holder_and_the_candidates_from_etcd() -> None:
    cluster = shared_cluster()
    url = cluster.url(fresh_prefix("status"))
    with sidecars(["a", "b"], url) as procs:
        async with observing(procs) as observer:
            leader = await observer.leader()
            await asyncio.sleep(2 * RENEW)  # both replicas have beaten once
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sidecar", "status", "--store", url, "-o", "json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    (lease,) = status["leases"]
    assert (lease["holder"], lease["term"], lease["state"]) == (
        leader.identity,
        leader.term,
        "held",
    )
    assert {c["identity"] for c in status["candidates"]} == {p.identity for p in procs}
    assert status["store"] == url


# -- the cluster hurt (a cluster each) ------------------------------------------------------------


@pytest.mark.parametrize("whom", ["the member the sidecars talk to", "the Raft leader"])
async def test_sigkill_of_a_member_keeps_one_leader_on_the_next_endpoint(
    own_cluster: EtcdCluster, whom: str
) -> None:
    """Every sidecar talks to the first endpoint of its URL. Killing a member loses no
    acknowledged write (Raft): the leader's next renewal goes to the next endpoint, and
    leadership goes on under the same term, or moves under a higher one, never twice."""
    cluster = own_cluster
    with sidecars(["a", "b", "c"], cluster.url(fresh_prefix("member"))) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            victim = cluster.members[0] if whom.startswith("the member") else cluster.leader()
            killed_at = time.time()
            victim.kill()
            await asyncio.sleep(3 * LEASE)
            after = await observer.leader(after=killed_at + 2 * LEASE)
            assert after.term is not None
            assert first.term is not None
            assert after.term >= first.term
            unled = _longest_gap(observer, killed_at)
            assert unled < 2 * LEASE + 2, f"no leader for {unled:.2f}s after the kill"
    observer.assert_never_two_leaders()
    assert_fenced(observer)


async def test_a_paused_member_moves_the_sidecars_to_the_next_endpoint(
    own_cluster: EtcdCluster,
) -> None:
    """SIGSTOP of the member everyone talks to: requests time out there (no answer, no stale
    one), the client moves on, and a leader leads again through the others."""
    cluster = own_cluster
    with sidecars(["a", "b", "c"], cluster.url(fresh_prefix("pause"))) as procs:
        async with observing(procs) as observer:
            await observer.leader()
            paused_at = time.time()
            cluster.members[0].pause()
            try:
                again = await observer.leader(timeout=4 * LEASE + 3, after=paused_at + LEASE)
                assert again.term is not None
                moved = [
                    e
                    for p in procs
                    for e in p.logs
                    if e.get("msg") == "etcd endpoint failing; moving to the next"
                ]
                assert moved, "no sidecar moved to another endpoint"
            finally:
                cluster.members[0].resume()
    observer.assert_never_two_leaders()
    assert_fenced(observer)


async def test_without_quorum_the_leader_demotes_at_its_deadline_and_no_one_leads(
    own_cluster: EtcdCluster,
) -> None:
    """Two of three members down: the last one cannot commit or serve a linearizable read,
    so renewals fail (errors, never an old record), the leader answers 503 at its own
    deadline and nobody leads until the quorum is back; then a leader under a term at least
    as high."""
    cluster = own_cluster
    m0, m1, m2 = cluster.members
    with sidecars(["a", "b", "c"], cluster.url(fresh_prefix("quorum"), [m0])) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            lost_at = time.time()
            m1.kill()
            m2.kill()
            demoted = await observer.wait_for(
                lambda s: s.name == first.name and not s.leader and s.sent >= lost_at,
                timeout=LEASE + 1,
            )
            assert demoted.received < lost_at + LEASE + 0.3, (demoted, lost_at)
            await asyncio.sleep(2 * LEASE)
            back_at = time.time()
            m1.restart()
            m2.restart()
            cluster.wait_ready()
            during = [s for s in observer.samples if s.leader and demoted.sent <= s.sent < back_at]
            assert not during, during[:3]
            again = await observer.leader(timeout=4 * LEASE + 5, after=back_at)
            assert again.term is not None
            assert first.term is not None
            assert again.term >= first.term
            errors = [e for p in procs for e in p.logs if e.get("msg") == "etcd unavailable"]
            assert errors, "no sidecar said etcd was unavailable"
    observer.assert_never_two_leaders()
    assert_fenced(observer)


async def test_a_restore_from_an_older_snapshot_never_repeats_a_term(
    own_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """Rules 5 and 8 on etcd's store loss. Snapshot at term T, then hand-offs to higher terms,
    then every member restored from the snapshot: etcd shows term T again (and its revision
    goes back). The replicas that saw the later terms wait the loss out and their next grant
    jumps above every term seen; no term is ever served by two identities."""
    cluster = own_cluster
    prefix = fresh_prefix("restore")
    with sidecars(["a", "b", "c"], cluster.url(prefix)) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            cluster.save_snapshot(tmp_path / "snap.db")
            # Read now, not after the restore: by then a replica that saw the later terms may
            # already have written its loss marker (which carries the highest term it saw).
            snapshot_term = lease_value(cluster, prefix)["term"]
            assert isinstance(snapshot_term, int)
            leader = by_name(procs, first.name)
            for _ in range(2):  # two hand-offs: the snapshot falls behind by two terms
                handover = await signal_leader(observer, procs, signal.SIGTERM, within=3)
                replacement = SidecarProcess.start(
                    handover.leader.name + "2", cluster.url(prefix), lease_duration="1s"
                )
                procs.append(replacement)
                observer.watch(replacement)
                leader = handover.leader
            before_restore = max(s.term or 0 for s in observer.samples if s.leader)
            assert snapshot_term + 2 <= before_restore  # the restore takes etcd two terms back
            running = [p.name for p in procs if p.proc.poll() is None]
            await observer.all_seen(before_restore, running)  # a replacement may be starting
            restored_at = time.time()
            await asyncio.to_thread(cluster.restore_snapshot, tmp_path / "snap.db")
            again = await observer.leader(timeout=6 * LEASE + 5, after=restored_at + 0.5)
            assert again.term is not None
            assert again.term >= before_restore
            went_back = [
                e
                for p in procs
                for e in p.logs
                if e.get("msg") == "etcd: every lease is timed anew"
            ]
            assert went_back, "no sidecar started a new epoch after the restore"
            del leader
    observer.assert_never_two_leaders()
    served: dict[int, set[str]] = {}
    for sample in observer.samples:
        if sample.leader and sample.term is not None and sample.identity is not None:
            served.setdefault(sample.term, set()).add(sample.identity)
    assert all(len(ids) == 1 for ids in served.values()), served


# -- TLS and users -----------------------------------------------------------------------------


async def test_over_tls_with_a_user_the_right_files_lead_and_wrong_ones_never_do(
    tmp_path: Path,
) -> None:
    """etcds:// with the CA and a client certificate (without a CommonName: etcd's gateway
    refuses one with a CN when users are on), and a user whose role may write only under its
    prefix: that sidecar leads. A wrong CA, or a wrong password, never leads and says why,
    without printing the password."""
    good = etcd_tls_files(tmp_path, "good")
    wrong = TlsFiles.make(tmp_path, "wrong")
    cert, key = good.client_cert, good.client_key
    with etcd_cluster(tls=good) as cluster:
        cluster.enable_auth()
        prefix = fresh_prefix("tls")
        cluster.add_user("app", "app-pass-7", f"{prefix}/")
        tls = [
            "--etcd-ca-file", str(good.ca_cert),
            "--etcd-cert-file", str(cert),
            "--etcd-key-file", str(key),
            "--etcd-username", "app",
        ]  # fmt: skip
        url = cluster.url(prefix)
        trusting = SidecarProcess.start(
            "trusting", url, args=tls, env={"LEADER_SIDECAR_ETCD_PASSWORD": "app-pass-7"}
        )
        misled_args = list(tls)
        misled_args[1] = str(wrong.ca_cert)
        misled = SidecarProcess.start(
            "misled", url, args=misled_args, env={"LEADER_SIDECAR_ETCD_PASSWORD": "app-pass-7"}
        )
        forgetful = SidecarProcess.start(
            "forgetful", url, args=tls, env={"LEADER_SIDECAR_ETCD_PASSWORD": "not-the-pass-9"}
        )
        procs = [trusting, misled, forgetful]
        try:
            async with observing(procs) as observer:
                leader = await observer.leader(timeout=15)
                assert leader.name == "trusting"
                refused = misled.wait_log(lambda e: e.get("msg") == "etcd unavailable", 10)
                assert "SSL" in refused["error"] or "certificate" in refused["error"]
                denied = forgetful.wait_log(lambda e: e.get("msg") == "etcd unavailable", 10)
                assert "--etcd-password" in denied["error"]
                trusting.kill()
                await asyncio.sleep(2 * LEASE)
            assert not any(s.leader for s in observer.samples if s.name != "trusting")
            for proc in procs:
                assert not any(
                    "app-pass-7" in line or "not-the-pass-9" in line for line in proc.raw
                )
        finally:
            for proc in procs:
                proc.stop()


def _longest_gap(observer: LeaderObserver, since: float) -> float:
    """The longest time after ``since`` during which no sample showed a leader."""
    led = sorted(s.received for s in observer.samples if s.leader and s.sent >= since)
    marks = [since, *led]
    return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


async def test_a_leader_keeps_its_term_when_its_member_hangs_and_the_next_one_answers(
    own_cluster: EtcdCluster,
) -> None:
    """Recovery in one round trip: the member the sidecars talk to hangs (SIGSTOP) while the
    other two keep the cluster; the leader's renewal times out, and its next request, on the
    next endpoint, comes before its deadline: same term, no gap."""
    cluster = own_cluster
    lease = 2.0
    with sidecars(
        ["a", "b"], cluster.url(fresh_prefix("keep")), lease_duration=f"{lease:g}s"
    ) as procs:
        async with observing(procs) as observer:
            first = await observer.leader()
            await asyncio.sleep(lease)
            paused_at = time.time()
            cluster.members[0].pause()
            try:
                await observer.wait_for(
                    lambda s: s.leader and s.sent > paused_at + 3 * lease, timeout=20
                )
            finally:
                cluster.members[0].resume()
            reigns = {
                (s.identity, s.term) for s in observer.samples if s.leader and s.sent > paused_at
            }
            assert reigns == {(first.identity, first.term)}, sorted(reigns, key=str)
    observer.assert_never_two_leaders()
