"""Which proxy a request to the API server takes: kubectl's rules (Go's ``httpproxy``), cases
taken from Go's own tests of ``NO_PROXY``, and the proxy actually used end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.backends.kubernetes import open_kubernetes_client
from sidecar.backends.kubernetes.client import CallError, KubeApi, lease_path
from sidecar.backends.kubernetes.kubeconfig import Kubeconfig, KubeconfigError
from sidecar.backends.kubernetes.proxy import Proxy, ProxyError, from_environment, use_proxy
from sidecar.config import load
from sidecar.config_error import ConfigError
from tests.fakekube import FakeApiServer
from tests.kubernetes.conftest import LEASE, NAMESPACE
from tests.kubernetes.test_client import serve
from tests.redis.servers import TlsFiles
from tests.support.http_proxy import forward_proxy


@pytest.mark.parametrize(
    ("server", "no_proxy", "proxied"),
    [
        ("https://kube.corp.example:6443", "", True),
        ("https://localhost:6443", "", False),  # loopback: never proxied
        ("https://127.0.0.1:6443", "", False),
        ("https://127.9.9.9:6443", "", False),
        ("https://[::1]:6443", "", False),
        ("https://kube.corp.example:6443", "*", False),
        ("https://kube.corp.example:6443", "corp.example", False),  # itself and subdomains
        ("https://corp.example:6443", "corp.example", False),
        ("https://corp.example:6443", ".corp.example", True),  # a leading dot: subdomains only
        ("https://kube.corp.example:6443", ".corp.example", False),
        ("https://kube.corp.example:6443", "*.corp.example", False),
        ("https://notcorp.example:6443", "corp.example", True),  # a suffix, not a domain
        ("https://KUBE.Corp.Example:6443", " other.example , CORP.example ", False),
        ("https://kube.corp.example:6443", "corp.example:443", True),  # another port
        ("https://kube.corp.example:6443", "corp.example:6443", False),
        ("https://kube.corp.example", "corp.example:443", False),  # https's default port
        ("https://10.96.0.1:443", "10.0.0.0/8", False),  # a CIDR
        ("https://10.96.0.1:443", "192.168.0.0/16", True),
        ("https://10.96.0.1:443", "10.96.0.1", False),  # an address
        ("https://10.96.0.1:443", "10.96.0.1:6443", True),  # an address and another port
        ("https://10.96.0.1:443", "10.96.0.1:443", False),
        ("https://[fd00::1]:443", "fd00::/8", False),
        ("https://[fd00::1]:443", "[fd00::1]:443", False),
        ("https://10.96.0.1:443", "10.96.0.1.example", True),  # domains never match an address
        ("https://kube.example:443", "10.0.0.0/8", True),  # CIDRs never match a name
        ("https://kube.example:443", "not a cidr/8, ,", True),  # garbage is ignored
    ],
)
def test_no_proxy_follows_gos_rules(server: str, no_proxy: str, proxied: bool) -> None:
    assert use_proxy(server, no_proxy) is proxied


def test_the_environment_names_the_proxy_by_the_servers_scheme() -> None:
    environ = {
        "HTTPS_PROXY": "secure.proxy:3128",  # no scheme: http:// as Go reads it
        "http_proxy": "http://plain.proxy:8080",
        "https_proxy": "http://ignored.proxy:1",  # the upper-case name wins
    }
    assert from_environment("https://kube.example:6443", environ) == Proxy(
        "http://secure.proxy:3128"
    )
    assert from_environment("http://kube.example:8080", environ) == Proxy("http://plain.proxy:8080")
    assert from_environment("https://kube.example:6443", {"no_proxy": "*", **environ}) is None
    assert from_environment("https://kube.example:6443", {}) is None


def test_proxy_credentials_become_a_header_and_never_print() -> None:
    proxy = from_environment("https://kube.example", {"HTTPS_PROXY": "http://me:s3cr3t@p:3128"})
    assert proxy is not None
    assert proxy.url == "http://p:3128"
    assert proxy.headers == {"Proxy-Authorization": "Basic bWU6czNjcjN0"}
    assert "s3cr3t" not in repr(proxy)
    assert "bWU6" not in repr(proxy)


def test_a_socks_proxy_is_refused_with_the_reason_instead_of_bypassed() -> None:
    with pytest.raises(ProxyError, match="HTTPS_PROXY=socks5://p:1080: a socks5 proxy is not"):
        from_environment("https://kube.example", {"HTTPS_PROXY": "socks5://p:1080"})


def kubeconfig(path: Path, server: str, extra: str = "") -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {server}\n{extra}"
        "contexts:\n- name: c\n  context: {cluster: c, user: u}\n"
        "users:\n- name: u\n  user: {token: t0ken}\n"
    )
    return path


async def list_leases(config: Path) -> object:
    api = KubeApi(str(config), 5.0)
    try:
        return await api.request("list leases", "GET", lease_path(NAMESPACE))
    finally:
        await api.close()


async def test_https_proxy_from_the_environment_carries_the_requests(
    fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server name no DNS knows is reached only through the proxy; NO_PROXY naming it sends
    the request direct (and it fails to resolve)."""
    server = f"http://kube.test:{fake.port}"
    config = kubeconfig(tmp_path / "kc", server)
    async with forward_proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://me:pw@"))
        listed = await list_leases(config)
        assert listed["kind"] == "LeaseList"  # type: ignore[index]
        assert proxy.seen[0].request_line.startswith(f"GET {server}/apis/coordination")
        assert proxy.seen[0].proxy_authorization == "Basic bWU6cHc="
        monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.test")
        with pytest.raises(CallError) as failed:
            await list_leases(config)
        assert failed.value.status == 0
        assert len(proxy.seen) == 1


async def test_the_kubeconfigs_proxy_url_wins_over_the_environment(
    fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with forward_proxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        config = kubeconfig(tmp_path / "kc", f"http://kube.test:{fake.port}", "")
        text = config.read_text().replace("    server:", f"    proxy-url: {proxy.url}\n    server:")
        config.write_text(text)
        listed = await list_leases(config)
        assert listed["kind"] == "LeaseList"  # type: ignore[index]
        assert len(proxy.seen) == 1


def test_a_socks_proxy_url_in_the_kubeconfig_is_refused_when_read(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kc", "https://kube.example", "    proxy-url: socks5://p:1080\n")
    with pytest.raises(KubeconfigError, match="cluster 'c': proxy-url=socks5://p:1080: a socks5"):
        Kubeconfig.read(str(config))


async def test_an_https_server_is_reached_through_a_connect_tunnel_with_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy gets ``CONNECT`` with the credentials; the server behind it gets neither the
    proxy's credentials nor anything but our own token."""
    tls = TlsFiles.make(tmp_path)
    upstream, runner = await serve(tls)
    port = upstream.url.rpartition(":")[2]
    try:
        async with forward_proxy() as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://me:pw@"))
            extra = f"    certificate-authority: {tls.ca_cert}\n    tls-server-name: localhost\n"
            config = kubeconfig(tmp_path / "kc", f"https://kube.test:{port}", extra)
            api = KubeApi(str(config), 5.0)
            try:
                lease = await api.request("get lease", "GET", lease_path(NAMESPACE, LEASE))
            finally:
                await api.close()
        assert lease["metadata"]["name"] == LEASE
        assert proxy.seen[0].request_line == f"CONNECT kube.test:{port} HTTP/1.1"
        assert proxy.seen[0].proxy_authorization == "Basic bWU6cHc="
        headers = upstream.seen[0]["headers"]
        assert "Proxy-Authorization" not in headers
        assert headers["Authorization"] == "Bearer t0ken"
    finally:
        await runner.cleanup()


def test_a_socks_proxy_in_the_environment_stops_the_sidecar_at_start(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kc", "https://kube.example")
    environ = {"HTTPS_PROXY": "socks5://me:pw@p:1080", "NO_PROXY": "other.example"}
    loaded = load(["--store", "kubernetes", "--lease", "l", "--kubeconfig", str(config)], environ)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environ.items():
            patch.setenv(name, value)
        with pytest.raises(ConfigError) as refused:
            open_kubernetes_client(loaded)
    assert str(refused.value) == (
        "HTTPS_PROXY=socks5://me:***@p:1080: a socks5 proxy is not supported; "
        "use an http:// or https:// proxy"
    )
