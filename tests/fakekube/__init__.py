"""A small, honest fake of the Kubernetes API server for the Kubernetes backend's tests.

It copies the real kube-apiserver v1.36 recorded in ``recorded/`` (see ``recorded/NOTES.md``):
one global resourceVersion counter, 409/404/422/400 Status bodies, MicroTime validation,
create-on-update for Leases, chunked watch streams with bookmarks and a 410 ``ERROR`` event
for a too-old resourceVersion, Pods' label patches, core/v1 Events, and enough discovery,
Table and OpenAPI for ``kubectl get/apply/delete lease`` and ``kubectl get lease -w``.
``test_replay.py`` replays recorded exchanges against it; ``test_kubectl.py`` drives it with
a real kubectl.

In-process: ``async with running() as fake`` (`server.FakeApiServer`).
Own process: ``with fake_kube_process() as fake`` (`process.FakeKubeProcess`).
"""

from tests.fakekube.process import FakeKubeClient, FakeKubeProcess, fake_kube_process
from tests.fakekube.server import FakeApiServer, kubeconfig, running, write_kubeconfig

__all__ = [
    "FakeApiServer",
    "FakeKubeClient",
    "FakeKubeProcess",
    "fake_kube_process",
    "kubeconfig",
    "running",
    "write_kubeconfig",
]
