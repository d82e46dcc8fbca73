"""Fixtures: an in-process fake API server and Kubernetes stores talking to it through the
sidecar's own client (`sidecar.backends.kubernetes.client`) and a kubeconfig."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sidecar.backends.kubernetes import KubernetesLeaseStore
from sidecar.backends.kubernetes.client import KubeApi
from sidecar.backends.kubernetes.reflector import CLIENT_GO, Pacing
from sidecar.clock import SYSTEM_CLOCK, Clock
from tests.fakekube import FakeApiServer, running, write_kubeconfig

NAMESPACE = "demo"
LEASE = "my-app"

StoreFactory = Callable[..., KubernetesLeaseStore]


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    async with running() as server:
        yield server


@pytest.fixture
def kubeconfig(fake: FakeApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", fake.url, NAMESPACE)


@pytest.fixture
async def make_store(kubeconfig: Path) -> AsyncIterator[StoreFactory]:
    stores: list[KubernetesLeaseStore] = []

    def make(
        *,
        clock: Clock = SYSTEM_CLOCK,
        request_timeout: float = 2.0,
        watch_timeout: float = 60.0,
        pacing: Pacing = CLIENT_GO,
    ) -> KubernetesLeaseStore:
        store = KubernetesLeaseStore(
            NAMESPACE,
            LEASE,
            api=KubeApi(str(kubeconfig), request_timeout),
            default_duration=2.0,
            clock=clock,
            watch_timeout=watch_timeout,
            pacing=pacing,
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()
