"""A small, honest fake of the Kubernetes API server for the Kubernetes backend's tests.

It copies the real kube-apiserver v1.36 recorded in ``recorded/`` (see ``recorded/NOTES.md``):
one global resourceVersion counter, 409/404/422/400 Status bodies, MicroTime validation,
create-on-update for Leases, chunked watch streams with bookmarks and a 410 ``ERROR`` event
for a too-old resourceVersion, Pods' label patches, core/v1 Events, and enough discovery,
Table and OpenAPI for ``kubectl get/apply/delete lease`` and ``kubectl get lease -w``.
``test_replay.py`` replays recorded exchanges against it; ``test_kubectl.py`` drives it with
a real kubectl.

Where it knowingly differs from the real server (each is something nothing here relies on):
plain HTTP/1.1 without TLS or protobuf; ``system:anonymous`` is authorized by default (kubectl
sends no bearer token over plain HTTP; ``anonymous=False`` restores the recorded 403);
``managedFields`` are approximated; no admission defaults beyond the recorded Pod defaults
(no service-account token volume); no server-side apply (a 415 that says so) and no
``events.k8s.io`` API (a 404) — refused, never faked; LIST ignores ``resourceVersion`` and
serves the current state; a too-old watch is decided by the fake's own history window, which
``compact()`` empties.

RBAC is off unless asked for (``authz.py``): given Roles, RoleBindings and a token table
(``FakeApiServer(authorizer=...)`` or ``PUT /_fake/rbac``), it authenticates and authorizes
every resource request as kube-apiserver's RBAC does and answers the recorded 403.

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
