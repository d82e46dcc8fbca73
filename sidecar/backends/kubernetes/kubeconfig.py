"""Where the API server is and how to prove who we are: the pod's service account, or a
kubeconfig.

* In a pod: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the service
  account's CA, and its token *re-read every minute* — bound service account tokens are
  rotated by the kubelet (about hourly), and a token read once at start stops working.
* A kubeconfig (``--kubeconfig``/``KUBECONFIG``, a list joined by ``:`` merged the way kubectl
  merges it: the first file to define a name wins): the current context's cluster (``server``,
  ``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``tls-server-name``,
  ``proxy-url``) and user (``token``, ``tokenFile`` re-read like the service account's,
  ``client-certificate(-data)`` + ``client-key(-data)``, ``username``/``password``). Relative
  paths are relative to the file that names them. PyYAML is imported only here.
* A user that authenticates with an ``exec`` plugin or an ``auth-provider`` (EKS, GKE, OIDC
  setups on a laptop): the official ``kubernetes`` package's loader runs the plugin and
  refreshes its credential (``pip install 'leader-sidecar[kubeconfig-exec]'``); it is imported
  only for such a kubeconfig, off the event loop. Without it, a one-line error names the fix.
  Re-implementing the plugin protocols (interactive prompts, cluster info, caching, a dozen
  providers) is not worth it for what is a development-only path: in a pod the sidecar uses
  its service account.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from sidecar.config import SERVICE_ACCOUNT_DIR

TOKEN_REREAD_SECONDS = 60.0
"""How often a token file is read again (client-go and the official Python client: a minute)."""

EXEC_FIX = (
    "install the official client for it (pip install 'leader-sidecar[kubeconfig-exec]'), or "
    "use a kubeconfig with a token, tokenFile or client certificate"
)


class KubeconfigError(Exception):
    """A configuration that cannot be used; the message names the file and the fix."""


class Credentials(Protocol):
    async def headers(self) -> dict[str, str]: ...


class NoCredentials:
    async def headers(self) -> dict[str, str]:
        return {}


@dataclasses.dataclass(frozen=True)
class StaticHeader:
    """A bearer token or basic credentials written in the kubeconfig itself."""

    value: str

    async def headers(self) -> dict[str, str]:
        return {"Authorization": self.value}


class TokenFile:
    """A bearer token read from a file, again every `TOKEN_REREAD_SECONDS`. A failed re-read
    keeps the last token (the kubelet replaces the file atomically; a transient error should
    not fail a renewal); with no token read yet it raises."""

    def __init__(
        self,
        path: Path,
        every: float = TOKEN_REREAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.every = every
        self._clock = clock
        self._token: str | None = None
        self._read_at = float("-inf")

    def token(self) -> str:
        now = self._clock()
        if self._token is None or now - self._read_at >= self.every:
            try:
                token = self.path.read_text().strip()
            except OSError as exc:
                if self._token is None:
                    raise KubeconfigError(f"cannot read the token file {self.path}: {exc}") from exc
            else:
                self._token = token
                self._read_at = now
        assert self._token is not None
        return self._token

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}


@dataclasses.dataclass
class Connection:
    """What every request needs: the server's base URL and how to reach and prove ourselves."""

    server: str
    ssl: ssl.SSLContext | bool  # True: aiohttp's default (plain http, or the system's CAs)
    credentials: Credentials
    server_hostname: str | None = None
    proxy: str | None = None
    namespace: str | None = None  # the context's, or the service account's: informational


async def load(kubeconfig: str | None) -> Connection:
    """The kubeconfig ``kubeconfig`` (a path, or paths joined by ``:``), else the pod's
    service account. Raises `KubeconfigError`."""
    if kubeconfig is None:
        return in_cluster(os.environ)
    config = Kubeconfig.read(kubeconfig)
    if config.needs_plugin:
        return await asyncio.to_thread(official_loader, kubeconfig, config)
    return config.connection()


def in_cluster(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError("not in a pod: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = directory / "ca.crt"
    try:
        namespace = (directory / "namespace").read_text().strip() or None
    except OSError:
        namespace = None
    return Connection(
        server=f"https://{host}:{port}",
        ssl=tls_context(ca_file=str(ca) if ca.is_file() else None),
        credentials=TokenFile(directory / "token"),
        namespace=namespace,
    )


def tls_context(
    *,
    ca_file: str | None = None,
    ca_data: bytes | None = None,
    insecure: bool = False,
    cert_file: str | None = None,
    key_file: str | None = None,
    cert_data: bytes | None = None,
    key_data: bytes | None = None,
) -> ssl.SSLContext:
    """A client TLS context: the given CA (else the system's), our certificate if any."""
    context = ssl.create_default_context(
        cafile=ca_file, cadata=ca_data.decode() if ca_data else None
    )
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_data is not None or key_data is not None:
        cert = cert_data if cert_data is not None else Path(cert_file or "").read_bytes()
        key = key_data if key_data is not None else Path(key_file or "").read_bytes()
        with _readable(cert) as cert_path, _readable(key) as key_path:
            context.load_cert_chain(cert_path, key_path)
    elif cert_file or key_file:
        context.load_cert_chain(cert_file or "", key_file)
    return context


@contextlib.contextmanager
def _readable(data: bytes) -> Iterator[str]:
    """A path holding ``data`` while the block runs (ssl loads certificates from files only):
    an anonymous in-memory file where Linux has them, so a read-only root filesystem needs no
    writable /tmp; else a private temporary directory, removed at once."""
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fd = os.memfd_create("leader-sidecar-tls")
        try:
            with open(fd, "wb", closefd=False) as memory:
                memory.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="leader-sidecar-") as private:
        path = Path(private, "tls.pem")
        path.write_bytes(data)
        yield str(path)


@dataclasses.dataclass
class _Entry:
    """One named cluster, user or context, with the directory of the file that defined it."""

    fields: dict[str, Any]
    base: Path


class Kubeconfig:
    """A kubeconfig (or several, merged) resolved to its current context."""

    def __init__(self, source: str, cluster: _Entry, user: _Entry, namespace: str | None) -> None:
        self.source = source
        self.cluster = cluster
        self.user = user
        self.namespace = namespace

    @classmethod
    def read(cls, paths: str) -> Kubeconfig:
        import yaml  # only for a kubeconfig

        sections: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
        current: str | None = None
        for name in [p for p in paths.split(os.pathsep) if p]:
            path = Path(name).expanduser()
            try:
                raw = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise KubeconfigError(f"kubeconfig {path}: cannot read it: {exc}") from exc
            if not isinstance(raw, dict):
                raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (not a mapping)")
            current = current or raw.get("current-context") or None
            for section, key in (
                ("clusters", "cluster"),
                ("users", "user"),
                ("contexts", "context"),
            ):
                for item in raw.get(section) or []:
                    if isinstance(item, dict) and item.get("name") is not None:
                        entry = _Entry(dict(item.get(key) or {}), path.parent)
                        sections[section].setdefault(str(item["name"]), entry)
        if not current:
            raise KubeconfigError(
                f"kubeconfig {paths}: no current-context; set one (kubectl config use-context NAME)"
            )
        context = sections["contexts"].get(current)
        if context is None:
            raise KubeconfigError(
                f"kubeconfig {paths}: current-context {current!r} is not among its contexts"
            )
        cluster_name = context.fields.get("cluster")
        cluster = sections["clusters"].get(str(cluster_name))
        if cluster is None or not cluster.fields.get("server"):
            raise KubeconfigError(
                f"kubeconfig {paths}: context {current!r} names cluster {cluster_name!r}, "
                "which is missing or has no server"
            )
        user = sections["users"].get(str(context.fields.get("user")), _Entry({}, cluster.base))
        return cls(paths, cluster, user, context.fields.get("namespace") or None)

    @property
    def needs_plugin(self) -> bool:
        """The user authenticates through an exec plugin or auth provider and has no token or
        client certificate of its own (client-go tries those first too)."""
        own = ("token", "tokenFile", "client-certificate", "client-certificate-data")
        plugin = "exec" in self.user.fields or "auth-provider" in self.user.fields
        return plugin and not any(self.user.fields.get(key) for key in own)

    def connection(self) -> Connection:
        cluster, user = self.cluster.fields, self.user.fields
        server = str(cluster["server"]).rstrip("/")
        try:
            context: ssl.SSLContext | bool = True
            if server.startswith("https:"):
                context = tls_context(
                    ca_file=self._path(self.cluster, "certificate-authority"),
                    ca_data=self._data(cluster, "certificate-authority-data"),
                    insecure=bool(cluster.get("insecure-skip-tls-verify")),
                    cert_file=self._path(self.user, "client-certificate"),
                    key_file=self._path(self.user, "client-key"),
                    cert_data=self._data(user, "client-certificate-data"),
                    key_data=self._data(user, "client-key-data"),
                )
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(f"kubeconfig {self.source}: TLS settings: {exc}") from exc
        credentials: Credentials = NoCredentials()
        if user.get("token"):
            credentials = StaticHeader(f"Bearer {user['token']}")
        elif user.get("tokenFile"):
            credentials = TokenFile(Path(self._path(self.user, "tokenFile") or ""))
        elif user.get("username") is not None and user.get("password") is not None:
            pair = f"{user['username']}:{user['password']}".encode()
            credentials = StaticHeader("Basic " + base64.b64encode(pair).decode())
        return Connection(
            server=server,
            ssl=context,
            credentials=credentials,
            server_hostname=cluster.get("tls-server-name") or None,
            proxy=cluster.get("proxy-url") or None,
            namespace=self.namespace,
        )

    @staticmethod
    def _path(entry: _Entry, key: str) -> str | None:
        value = entry.fields.get(key)
        return str(entry.base / Path(str(value)).expanduser()) if value else None

    def _data(self, fields: dict[str, Any], key: str) -> bytes | None:
        value = fields.get(key)
        if not value:
            return None
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError as exc:
            raise KubeconfigError(f"kubeconfig {self.source}: {key} is not base64") from exc


class _PluginCredentials:
    """The bearer token the official loader got from an exec plugin or auth provider,
    refreshed through its hook (which re-runs the plugin once the credential expires)."""

    CHECK_EVERY = 10.0

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self._checked = time.monotonic()
        self._lock = asyncio.Lock()

    def _header(self) -> dict[str, str]:
        value = self.configuration.api_key.get("BearerToken") or self.configuration.api_key.get(
            "authorization"
        )
        return {"Authorization": str(value)} if value else {}

    async def headers(self) -> dict[str, str]:
        hook = self.configuration.refresh_api_key_hook
        if hook is not None and time.monotonic() - self._checked >= self.CHECK_EVERY:
            async with self._lock:
                if time.monotonic() - self._checked >= self.CHECK_EVERY:
                    await asyncio.to_thread(hook, self.configuration)
                    self._checked = time.monotonic()
        return self._header()


def official_loader(paths: str, config: Kubeconfig) -> Connection:
    """The connection of a kubeconfig whose user needs a plugin, through the official client
    (blocking: it may run the plugin; call it on a thread)."""
    kind = "exec plugin" if "exec" in config.user.fields else "auth-provider"
    try:
        from kubernetes import client  # only for such a kubeconfig
        from kubernetes import config as kube_config
    except ImportError:
        raise KubeconfigError(
            f"kubeconfig {paths}: its user authenticates with an {kind}; {EXEC_FIX}"
        ) from None
    configuration = client.Configuration()
    try:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except Exception as exc:
        raise KubeconfigError(f"kubeconfig {paths}: the {kind} failed: {exc}") from exc
    server = str(configuration.host).rstrip("/")
    context: ssl.SSLContext | bool = True
    if server.startswith("https:"):
        context = tls_context(
            ca_file=configuration.ssl_ca_cert or None,
            insecure=not configuration.verify_ssl,
            cert_file=configuration.cert_file or None,
            key_file=configuration.key_file or None,
        )
    return Connection(
        server=server,
        ssl=context,
        credentials=_PluginCredentials(configuration),
        server_hostname=getattr(configuration, "tls_server_name", None) or None,
        proxy=configuration.proxy or None,
        namespace=config.namespace,
    )
