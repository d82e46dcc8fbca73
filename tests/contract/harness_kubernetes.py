"""The Kubernetes store against the fake API server (in this process, on a free port),
through the sidecar's own client and a kubeconfig, as the sidecar runs outside a
cluster."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from sidecar.backends.kubernetes import KubernetesLeaseStore, KubernetesStoreClient
from sidecar.backends.kubernetes.client import KubeApi
from tests.contract.harness import HarnessIterator
from tests.fakekube import FakeApiServer, running, write_kubeconfig
from tests.fakekube.wire import LEASES

NAMESPACE = "demo"
LEASE = "contract"


class KubernetesHarness:
    lease_name = LEASE

    def __init__(self, fake: FakeApiServer, kubeconfig: Path) -> None:
        self.fake = fake
        self.kubeconfig = kubeconfig
        self.stores: list[KubernetesLeaseStore | KubernetesStoreClient] = []

    def _api(self) -> KubeApi:
        # Generous: 50 clients at once against the fake on 2 busy cores must not time out
        # (a timed-out winner would hide the grant the test counts).
        return KubeApi(str(self.kubeconfig), request_timeout=20.0)

    def new_store(self) -> KubernetesLeaseStore:
        """A single-lease store with a client of its own (its own per-name watch)."""
        store = KubernetesLeaseStore(NAMESPACE, LEASE, api=self._api(), default_duration=30.0)
        self.stores.append(store)
        return store

    def new_client(self) -> KubernetesStoreClient:
        """A replica serving many leases: one client, one shared namespace watch."""
        client = KubernetesStoreClient(
            NAMESPACE, api=self._api(), group=LEASE, shared_watch=True, default_duration=30.0
        )
        self.stores.append(client)
        return client

    async def reset(self) -> None:
        """Delete the Lease object, as an operator's ``kubectl delete lease`` would."""
        if self.fake.cluster.get(LEASES, NAMESPACE, LEASE) is not None:
            self.fake.cluster.delete(LEASES, NAMESPACE, LEASE)


@contextlib.asynccontextmanager
async def kubernetes_harness() -> HarnessIterator:
    with tempfile.TemporaryDirectory() as tmp:
        async with running() as fake:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", fake.url, NAMESPACE)
            harness = KubernetesHarness(fake, kubeconfig)
            try:
                yield harness
            finally:
                for store in harness.stores:
                    await store.close()


HARNESS = kubernetes_harness
