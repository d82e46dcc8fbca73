"""One probe per sidecar while the API server refuses (issue 20), counted in the fake API
server's request log: a sidecar with many leases sends one request per retry period, not one
per lease, and every lease is led again as soon as the API answers."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry

from sidecar.backends.kubernetes import KubernetesStoreClient
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.lease_set import LeaseSet
from sidecar.metrics import Metrics
from sidecar.timing import Timing
from tests.fakekube import FakeApiServer
from tests.kubernetes.conftest import NAMESPACE
from tests.kubernetes.test_watch import until

TIMING = Timing.build(4.0, 1.0, 0.4, 0.5)  # whole seconds, as Kubernetes counts leases
LEASES = 24  # above the per-name watch limit: one shared watch


def sent_since(fake: FakeApiServer, moment: float) -> Counter[str]:
    """Requests by verb since ``moment``, the watch loops' lists and watches left out (they
    back off on their own)."""
    return Counter(
        str(r["verb"])
        for r in fake.requests
        if float(r["t"]) >= moment and r["verb"] not in ("list", "watch")
    )


async def test_a_sidecar_asks_a_refusing_api_server_once_per_retry_period(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    client = KubernetesStoreClient(
        NAMESPACE,
        api=KubeApi(str(kubeconfig), TIMING.request_timeout),
        group="jobs",
        shared_watch=True,
        default_duration=TIMING.lease_duration,
    )
    registry = CollectorRegistry()
    lease_set = LeaseSet.open(
        client,
        [(f"jobs-{i}", f"{NAMESPACE}/jobs-{i}") for i in range(LEASES)],
        TIMING,
        "a_0000",
        group="jobs",
        registry_metrics=lambda lease: Metrics(registry, lease, TIMING.lease_duration),
        rng=random.Random(5),
    )
    await lease_set.prime(1.0)
    running = asyncio.create_task(lease_set.run())
    try:
        await until(lambda: len(lease_set.held()) == LEASES, 20)
        fake.faults = fake.faults.parse(
            {
                "errors": [
                    {
                        "status": 503,
                        "match": {"verbs": ["get", "create", "update", "patch"]},
                    }
                ]
            }
        )
        await until(lambda: not lease_set.held(), 2 * TIMING.lease_duration)
        # A leader's last try before its deadline may still be on its way when it demotes
        # (CI once counted one such patch at the fake just after): bounded by the request
        # timeout, so the window starts once that has passed.
        await asyncio.sleep(TIMING.request_timeout)
        window = 10 * TIMING.retry_period
        began = time.monotonic()
        await asyncio.sleep(window)
        sent = sent_since(fake, began)
        assert set(sent) <= {"get"}, f"only the probe's reads while refusing: {sent}"
        assert 4 <= sent["get"] <= window / TIMING.retry_period + 1, sent
        fake.faults = fake.faults.parse({})
        back = await until(lambda: len(lease_set.held()) == LEASES, 5)
        assert back < 1.5 * TIMING.retry_period + 1.0
    finally:
        lease_set.stop()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await client.close()
