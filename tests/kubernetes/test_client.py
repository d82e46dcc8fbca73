"""Our REST client of the Kubernetes API (sidecar/backends/kubernetes/client.py, kubeconfig.py):
kubeconfigs with a token and a CA, inline CA and client-certificate data, a refused unknown CA
and ``insecure-skip-tls-verify``, merged kubeconfig lists, the service account's token re-read
as the kubelet rotates it, an exec plugin through the official loader (and the error without
it), watch lines (split, bounded, a huge one refused), and no ``kubernetes`` import on the
sidecar's runtime path."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sidecar.backends.kubernetes.client import USER_AGENT, CallError, KubeApi, lease_path
from sidecar.backends.kubernetes.kubeconfig import (
    Kubeconfig,
    KubeconfigError,
    TokenFile,
    in_cluster,
    load,
)
from sidecar.backends.kubernetes.watch import (
    MAX_EVENT_LINE,
    Selection,
    WatchBroken,
    event_lines,
    stream_leases,
)
from tests.fakekube import FakeApiServer
from tests.kubernetes.conftest import LEASE, NAMESPACE
from tests.redis.servers import TlsFiles

LEASE_JSON = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": LEASE, "namespace": NAMESPACE, "uid": "u-1", "resourceVersion": "7"},
    "spec": {"holderIdentity": "app-0_aaaa", "leaseTransitions": 3},
}


class Upstream:
    """A minimal API server: answers a Lease GET, and a watch with whatever `watch_body` holds;
    records each request's headers and the client certificate's subject."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.watch_body = b""
        self.url = ""

    async def lease(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item[0] for item in peer["subject"]) if peer else {}
        self.seen.append({"headers": dict(request.headers), "client": subject.get("commonName")})
        return web.json_response(LEASE_JSON)

    async def leases(self, request: web.Request) -> web.StreamResponse:
        self.seen.append({"headers": dict(request.headers), "query": dict(request.query)})
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(self.watch_body)
        await response.write_eof()
        return response


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return TlsFiles.make(tmp_path)


async def serve(
    tls: TlsFiles | None, *, require_client_cert: bool = False
) -> tuple[Upstream, web.AppRunner]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_get(lease_path(NAMESPACE, LEASE), upstream.lease)
    app.router.add_get(lease_path(NAMESPACE), upstream.leases)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = None
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(tls.server_cert), str(tls.server_key))
        if require_client_cert:
            context.load_verify_locations(str(tls.ca_cert))
            context.verify_mode = ssl.CERT_REQUIRED
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    upstream.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    return upstream, runner


@pytest.fixture
async def https(tls: TlsFiles) -> AsyncIterator[Upstream]:
    upstream, runner = await serve(tls)
    yield upstream
    await runner.cleanup()


@pytest.fixture
async def mtls(tls: TlsFiles) -> AsyncIterator[Upstream]:
    upstream, runner = await serve(tls, require_client_cert=True)
    yield upstream
    await runner.cleanup()


@pytest.fixture
async def plain() -> AsyncIterator[Upstream]:
    upstream, runner = await serve(None)
    yield upstream
    await runner.cleanup()


def kubeconfig(path: Path, cluster: str, user: str, namespace: str = "team-a") -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\n"
        "clusters:\n- name: c\n  cluster:\n" + textwrap.indent(cluster, "    ") + "\n"
        "contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\n"
        f"    namespace: {namespace}\n"
        "users:\n- name: u\n  user:\n" + textwrap.indent(user, "    ") + "\n"
    )
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


async def read_lease(config: Path) -> Any:
    api = KubeApi(str(config), 5.0)
    try:
        return await api.request("get lease", "GET", lease_path(NAMESPACE, LEASE))
    finally:
        await api.close()


async def test_a_kubeconfig_with_a_token_and_a_relative_ca_file_reaches_a_tls_server(
    https: Upstream, tls: TlsFiles
) -> None:
    """``certificate-authority`` is relative to the kubeconfig's directory; the token goes out
    as a bearer token."""
    config = kubeconfig(
        tls.directory / "kubeconfig",
        f"server: {https.url}\ncertificate-authority: {tls.ca_cert.name}",
        "token: s3cret",
    )
    assert await read_lease(config) == LEASE_JSON
    assert https.seen[0]["headers"]["Authorization"] == "Bearer s3cret"
    assert https.seen[0]["headers"]["User-Agent"] == USER_AGENT
    assert Kubeconfig.read(str(config)).namespace == "team-a"


async def test_a_kubeconfig_with_inline_ca_and_client_certificate_data_authenticates_by_certificate(
    mtls: Upstream, tls: TlsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``certificate-authority-data``, ``client-certificate-data``, ``client-key-data``; no
    Authorization header at all; the key never touches the temporary directory (a read-only
    root filesystem needs no writable /tmp)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    config = kubeconfig(
        tmp_path / "kubeconfig",
        f"server: {mtls.url}\ncertificate-authority-data: {b64(tls.ca_cert)}",
        f"client-certificate-data: {b64(tls.client_cert)}\nclient-key-data: {b64(tls.client_key)}",
    )
    assert await read_lease(config) == LEASE_JSON
    assert mtls.seen[0]["client"] == "test client"
    assert "Authorization" not in mtls.seen[0]["headers"]
    assert list(scratch.iterdir()) == []


async def test_client_certificate_files_authenticate_too(
    mtls: Upstream, tls: TlsFiles, tmp_path: Path
) -> None:
    config = kubeconfig(
        tmp_path / "kubeconfig",
        f"server: {mtls.url}\ncertificate-authority: {tls.ca_cert}",
        f"client-certificate: {tls.client_cert}\nclient-key: {tls.client_key}",
    )
    assert await read_lease(config) == LEASE_JSON
    assert mtls.seen[0]["client"] == "test client"


async def test_an_unknown_ca_is_refused_unless_tls_verification_is_skipped(
    https: Upstream, tmp_path: Path
) -> None:
    """Without the CA, a transport error (status 0) naming the certificate problem; with
    ``insecure-skip-tls-verify: true`` the request goes through."""
    strict = kubeconfig(tmp_path / "strict", f"server: {https.url}", "token: t")
    with pytest.raises(CallError) as refused:
        await read_lease(strict)
    assert refused.value.status == 0
    assert "certificate" in str(refused.value).lower()
    loose = kubeconfig(
        tmp_path / "loose", f"server: {https.url}\ninsecure-skip-tls-verify: true", "token: t"
    )
    assert await read_lease(loose) == LEASE_JSON


async def test_a_token_file_in_the_kubeconfig_is_read_relative_to_it(
    plain: Upstream, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("from-file\n")
    config = kubeconfig(tmp_path / "kubeconfig", f"server: {plain.url}", "tokenFile: token")
    assert await read_lease(config) == LEASE_JSON
    assert plain.seen[0]["headers"]["Authorization"] == "Bearer from-file"


def test_a_kubeconfig_list_is_merged_first_definition_wins(tmp_path: Path) -> None:
    """``KUBECONFIG=a:b``: the first file's current-context and entries win, as in kubectl."""
    first = tmp_path / "first"
    first.write_text("current-context: two\nusers:\n- name: u\n  user:\n    token: first-token\n")
    second = kubeconfig(tmp_path / "second", "server: http://127.0.0.1:1", "token: second")
    with second.open("a") as extra:
        extra.write("- name: u2\n  user:\n    token: x\n- name: ignored\n  user: {}\n")
    text = second.read_text().replace(
        "contexts:\n", "contexts:\n- name: two\n  context:\n    cluster: c\n    user: u\n"
    )
    second.write_text(text)
    config = Kubeconfig.read(f"{first}:{second}")
    assert config.user.fields == {"token": "first-token"}
    assert config.cluster.fields["server"] == "http://127.0.0.1:1"
    assert config.namespace is None  # context "two" names none


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: []\n", "no current-context"),
        ("current-context: nope\ncontexts: []\n", "'nope' is not among its contexts"),
        (
            "current-context: x\ncontexts:\n- name: x\n  context:\n    cluster: gone\n",
            "cluster 'gone', which is missing or has no server",
        ),
    ],
)
def test_a_kubeconfig_without_a_usable_context_is_refused_with_the_reason(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeconfigError, match=expected):
        Kubeconfig.read(str(path))


def test_the_service_account_token_is_read_again_every_minute(tmp_path: Path) -> None:
    """Bound tokens rotate (about hourly): a token read once at start stops working."""
    token = tmp_path / "token"
    token.write_text("first")
    now = [100.0]
    source = TokenFile(token, clock=lambda: now[0])
    assert source.token() == "first"
    token.write_text("second")
    now[0] += 59.0
    assert source.token() == "first"  # not re-read within the minute
    now[0] += 1.0
    assert source.token() == "second"
    token.unlink()  # mid-rotation: keep the last token rather than fail a renewal
    now[0] += 60.0
    assert source.token() == "second"


def test_in_cluster_uses_the_service_host_port_ca_and_token(tmp_path: Path, tls: TlsFiles) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(tls.ca_cert.read_bytes())
    (tmp_path / "namespace").write_text("pods-ns")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    connection = in_cluster(environ, tmp_path)
    assert connection.server == "https://[fd00::1]:6443"
    assert connection.namespace == "pods-ns"
    assert isinstance(connection.ssl, ssl.SSLContext)
    assert connection.ssl.verify_mode == ssl.CERT_REQUIRED
    assert asyncio.run(connection.credentials.headers()) == {"Authorization": "Bearer sa-token"}


EXEC_PLUGIN = """\
import json
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {"token": "from-plugin"},
}))
"""


def exec_kubeconfig(tmp_path: Path, server: str) -> Path:
    (tmp_path / "plugin.py").write_text(EXEC_PLUGIN)
    return kubeconfig(
        tmp_path / "kubeconfig",
        f"server: {server}",
        "exec:\n"
        "  apiVersion: client.authentication.k8s.io/v1\n"
        f"  command: {sys.executable}\n"
        f"  args: [{tmp_path / 'plugin.py'}]\n"
        "  interactiveMode: Never\n",
    )


async def test_an_exec_plugin_kubeconfig_gets_its_token_through_the_official_loader(
    plain: Upstream, tmp_path: Path
) -> None:
    config = exec_kubeconfig(tmp_path, plain.url)
    assert await read_lease(config) == LEASE_JSON
    assert plain.seen[0]["headers"]["Authorization"] == "Bearer from-plugin"


async def test_an_exec_plugin_kubeconfig_without_the_official_client_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    config = exec_kubeconfig(tmp_path, "http://127.0.0.1:1")
    with pytest.raises(KubeconfigError, match=r"exec plugin; install .*kubeconfig-exec"):
        await load(str(config))
    with pytest.raises(CallError, match="cannot load the Kubernetes client configuration"):
        await read_lease(config)


class Chunks:
    """A StreamReader stand-in that hands out the given chunks, then the end."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


async def lines(*chunks: bytes, limit: int = 100) -> list[bytes]:
    return [line async for line in event_lines(Chunks(*chunks), 1.0, limit)]  # type: ignore[arg-type]


async def test_watch_lines_are_split_on_newlines_across_chunks() -> None:
    assert await lines(b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}') == [
        b'{"a":1}',
        b'{"b":2}',
        b'{"c":3}',
    ]


async def test_a_watch_line_past_the_limit_is_refused_whether_split_or_whole() -> None:
    with pytest.raises(WatchBroken, match="longer than 100 bytes"):
        await lines(b"x" * 60, b"x" * 60)  # no newline yet: the buffer outgrows the limit
    with pytest.raises(WatchBroken, match="longer than 100 bytes"):
        await lines(b"x" * 150 + b"\n")
    assert await lines(b"x" * 100 + b"\n") == [b"x" * 100]


async def test_a_huge_watch_event_breaks_the_watch_instead_of_filling_memory(
    plain: Upstream, tmp_path: Path
) -> None:
    """The real stream: a first event, then one line past `MAX_EVENT_LINE`."""
    first = {"type": "ADDED", "object": LEASE_JSON}
    plain.watch_body = json.dumps(first).encode() + b"\n" + b"x" * (MAX_EVENT_LINE + 10)
    api = KubeApi(str(kubeconfig(tmp_path / "kc", f"server: {plain.url}", "token: t")), 5.0)
    seen = []

    async def follow() -> None:
        async for event in stream_leases(api, Selection(NAMESPACE), "5", 30.0, "watch"):
            seen.append(event)

    try:
        with pytest.raises(WatchBroken, match="longer than"):
            await follow()
    finally:
        await api.close()
    assert seen == [("ADDED", LEASE_JSON, "7")]
    assert plain.seen[0]["query"] == {
        "watch": "1",
        "resourceVersion": "5",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "30",
        "timeout": "30s",  # as client-go: the server drops a watch the client gave up on
    }


async def test_the_sidecar_on_kubernetes_never_imports_the_official_client(
    fake: FakeApiServer, kubeconfig: Path
) -> None:
    """Build the sidecar with the Kubernetes store, read the Lease, record an Event: the
    ``kubernetes`` package (≈58 MiB, ≈0.9 s to import) stays out of the process."""
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        from sidecar.config import load
        from sidecar.app import Sidecar
        from sidecar.backends.kubernetes import open_kubernetes_client
        config = load(["--store", "kubernetes", "--kubeconfig", {str(kubeconfig)!r},
                       "--namespace", "{NAMESPACE}", "--lease", "{LEASE}"], environ={{}})
        Sidecar(config).open()
        async def main():
            client = open_kubernetes_client(config)
            store = client.lease("{LEASE}")
            print(await store.read())
            await client.close()
        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.split(".")[0] == "kubernetes"))
        """
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == ["None", "[]"]
    assert any(r["resource"] == "leases" for r in fake.requests)


async def test_an_aiohttp_session_is_one_pool_for_all_requests(
    plain: Upstream, tmp_path: Path
) -> None:
    """Keep-alive: several requests, one connection."""
    api = KubeApi(str(kubeconfig(tmp_path / "kc", f"server: {plain.url}", "token: t")), 5.0)
    try:
        for _ in range(3):
            await api.request("get lease", "GET", lease_path(NAMESPACE, LEASE))
        _, session = await api._connect()
        connector = session.connector
        assert isinstance(connector, aiohttp.TCPConnector)
        assert sum(len(c) for c in connector._conns.values()) == 1
    finally:
        await api.close()
