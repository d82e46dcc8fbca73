"""Where the API server is and how to prove who we are: the pod's service account, or a
kubeconfig.

* In a pod: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the service
  account's CA, and its token *re-read every minute* — bound service account tokens are
  rotated by the kubelet (about hourly), and a token read once at start stops working.
* A kubeconfig (``--kubeconfig``/``KUBECONFIG``, a list joined by ``:`` merged the way kubectl
  merges it: the first file to define a name wins, a file of the list that does not exist is
  skipped): the current context's cluster (``server``, ``certificate-authority(-data)``,
  ``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url``) and user (``token``,
  ``tokenFile`` re-read like the service account's, ``client-certificate(-data)`` +
  ``client-key(-data)``, ``username``/``password``, and impersonation: ``as``, ``as-uid``,
  ``as-groups``, ``as-user-extra`` sent as ``Impersonate-*`` headers). Relative paths are
  relative to the file that names them. PyYAML is imported only here.
* Checked as kubectl checks them, at start: a boolean must be a YAML boolean (the string
  ``"false"`` is refused, not read as true), a CA together with ``insecure-skip-tls-verify`` is
  refused, impersonation of groups, uid or extras needs ``as``.
* A token file that is empty or unreadable keeps the last good token (a kubeconfig's ``token``
  beside its ``tokenFile`` is that first token, as in client-go); with none, the request fails
  and names the file. A ``401`` makes the client read the file again at once (`refresh`).
* The proxy: the kubeconfig's ``proxy-url``, else the environment's (`sidecar.backends.
  kubernetes.proxy`, kubectl's rules, ``NO_PROXY`` included), in a pod too.
* Credentials never print: every ``repr`` here hides tokens, passwords and proxy credentials.
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

from sidecar.backends.kubernetes.proxy import Proxy, ProxyError, from_environment, parse_proxy
from sidecar.redact import redact_url
from sidecar.service_account import SERVICE_ACCOUNT_DIR

TOKEN_REREAD_SECONDS = 60.0
"""How often a token file is read again (client-go and the official Python client: a minute)."""

EXEC_FIX = (
    "install the official client for it (pip install 'leader-sidecar[kubeconfig-exec]'), or "
    "use a kubeconfig with a token, tokenFile or client certificate"
)

Headers = list[tuple[str, str]]
"""Request headers as pairs: ``Impersonate-Group`` may repeat."""


class KubeconfigError(Exception):
    """A configuration that cannot be used; the message names the file and the fix."""


class Credentials(Protocol):
    async def headers(self) -> dict[str, str]: ...

    async def refresh(self) -> bool:
        """After a ``401``: read the credential again now. True if it changed (the request is
        worth one more try)."""
        ...


class NoCredentials:
    async def headers(self) -> dict[str, str]:
        return {}

    async def refresh(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoCredentials()"


class StaticHeader:
    """A bearer token or basic credentials written in the kubeconfig itself."""

    def __init__(self, value: str) -> None:
        self._value = value

    async def headers(self) -> dict[str, str]:
        return {"Authorization": self._value}

    async def refresh(self) -> bool:
        return False

    def __repr__(self) -> str:
        scheme = self._value.partition(" ")[0]
        return f"StaticHeader({scheme} ***)"


class TokenFile:
    """A bearer token read from a file, again every `TOKEN_REREAD_SECONDS` and after a
    ``401``. A failed or empty read keeps the last good token (the kubelet replaces the file
    atomically; a transient error should not fail a renewal, and an empty token would be sent
    as ``Bearer `` and refused); ``fallback`` (a kubeconfig's ``token`` beside its ``tokenFile``)
    is that last good token until the file gives one. With no token at all it raises."""

    def __init__(
        self,
        path: Path,
        every: float = TOKEN_REREAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        fallback: str | None = None,
    ) -> None:
        self.path = path
        self.every = every
        self._clock = clock
        self._token: str | None = fallback or None
        self._read_at = float("-inf")
        self.last_error: str | None = None  # why the last read gave no token, for the error

    def token(self, *, now: bool = False) -> str:
        """The token; read from the file first if it is due (or ``now``)."""
        moment = self._clock()
        if now or moment - self._read_at >= self.every:
            self._read_at = moment
            self._read()
        if self._token is None:
            raise KubeconfigError(f"no token from {self.path}: {self.last_error}")
        return self._token

    def _read(self) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            self.last_error = f"cannot read it: {exc.strerror or exc}"
            return
        if not token:
            self.last_error = "the file is empty"
            return
        self.last_error = None
        self._token = token

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    async def refresh(self) -> bool:
        before = self._token
        try:
            return self.token(now=True) != before
        except KubeconfigError:
            return False

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"


@dataclasses.dataclass
class Connection:
    """What every request needs: the server's base URL and how to reach and prove ourselves."""

    server: str
    ssl: ssl.SSLContext | bool  # True: aiohttp's default (plain http, or the system's CAs)
    credentials: Credentials
    server_hostname: str | None = None
    proxy: Proxy | None = None
    namespace: str | None = None  # the context's, or the service account's: informational
    impersonation: tuple[tuple[str, str], ...] = ()  # Impersonate-* headers, in order

    def __repr__(self) -> str:
        acting = [value for name, value in self.impersonation if name == "Impersonate-User"]
        return (
            f"Connection(server={redact_url(self.server)!r}, credentials={self.credentials!r}, "
            f"proxy={self.proxy!r}, server_hostname={self.server_hostname!r}, "
            f"namespace={self.namespace!r}, impersonating={acting[0] if acting else None!r})"
        )


async def load(kubeconfig: str | None, environ: Mapping[str, str] | None = None) -> Connection:
    """The kubeconfig ``kubeconfig`` (a path, or paths joined by ``:``), else the pod's
    service account. Raises `KubeconfigError`."""
    environ = os.environ if environ is None else environ
    if kubeconfig is None:
        return in_cluster(environ)
    config = Kubeconfig.read(kubeconfig)
    if config.needs_plugin:
        return await asyncio.to_thread(official_loader, kubeconfig, config)
    return config.connection(environ)


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
    server = f"https://{host}:{port}"
    return Connection(
        server=server,
        ssl=tls_context(ca_file=str(ca) if ca.is_file() else None),
        credentials=TokenFile(directory / "token"),
        proxy=environment_proxy(server, environ),
        namespace=namespace,
    )


def environment_proxy(server: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy the environment names for ``server`` (kubectl's rules). Raises
    `KubeconfigError` for one that cannot be used."""
    try:
        return from_environment(server, environ)
    except ProxyError as exc:
        raise KubeconfigError(str(exc)) from None


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
    name: str = ""


BOOLEANS = {"clusters": ("insecure-skip-tls-verify", "disable-compression")}
"""The boolean fields of a kubeconfig this client reads; each must be a YAML boolean."""

IMPERSONATION_FIX = "set as (the user to act as) too, or remove as-uid, as-groups and as-user-extra"


class Kubeconfig:
    """A kubeconfig (or several, merged) resolved to its current context."""

    def __init__(self, source: str, cluster: _Entry, user: _Entry, namespace: str | None) -> None:
        self.source = source
        self.cluster = cluster
        self.user = user
        self.namespace = namespace

    @classmethod
    def read(cls, paths: str) -> Kubeconfig:
        """Read, merge and check (`check`) the kubeconfig. A file of a list that does not
        exist is skipped, as kubectl skips it; if none exists, that is the error."""
        import yaml  # only for a kubeconfig

        sections: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
        current: str | None = None
        names = [p for p in paths.split(os.pathsep) if p]
        found = 0
        for name in names:
            path = Path(name).expanduser()
            if len(names) > 1 and not path.exists():
                continue
            try:
                raw = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise KubeconfigError(f"kubeconfig {path}: cannot read it: {exc}") from exc
            found += 1
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
                        fields = item.get(key) or {}
                        if not isinstance(fields, dict):
                            raise KubeconfigError(
                                f"kubeconfig {path}: {key} {item['name']!r} is not a mapping"
                            )
                        entry = _Entry(dict(fields), path.parent, str(item["name"]))
                        _check_booleans(path, section, entry)
                        sections[section].setdefault(str(item["name"]), entry)
        if not found:
            raise KubeconfigError(
                f"kubeconfig {paths}: none of these files exists; give the path of a kubeconfig"
            )
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
        config = cls(paths, cluster, user, context.fields.get("namespace") or None)
        config.check()
        return config

    def check(self) -> None:
        """What kubectl refuses, refused here too, before any request: a CA together with
        ``insecure-skip-tls-verify``, a proxy URL that cannot be used, impersonation that
        names no user or is not strings. Raises `KubeconfigError`."""
        cluster = self.cluster.fields
        has_ca = cluster.get("certificate-authority") or cluster.get("certificate-authority-data")
        if cluster.get("insecure-skip-tls-verify") is True and has_ca:
            raise KubeconfigError(
                f"kubeconfig {self.source}: cluster {self.cluster.name!r}: specifying a root "
                "certificates file with the insecure flag is not allowed; remove "
                "insecure-skip-tls-verify (or the certificate-authority)"
            )
        if cluster.get("proxy-url"):
            self.proxy()
        self.impersonation()

    def proxy(self) -> Proxy | None:
        """The cluster's ``proxy-url``, or None. Raises `KubeconfigError`."""
        value = self.cluster.fields.get("proxy-url")
        if not value:
            return None
        try:
            return parse_proxy(str(value), "proxy-url")
        except ProxyError as exc:
            raise KubeconfigError(
                f"kubeconfig {self.source}: cluster {self.cluster.name!r}: {exc}"
            ) from None

    def impersonation(self) -> tuple[tuple[str, str], ...]:
        """The user's ``as``, ``as-uid``, ``as-groups`` and ``as-user-extra`` as client-go
        sends them: ``Impersonate-User``, ``-Uid``, one ``Impersonate-Group`` per group, one
        ``Impersonate-Extra-<key>`` per value (the key escaped as client-go escapes it).
        Raises `KubeconfigError` for anything else than strings, or any of them without
        ``as``."""
        fields = self.user.fields
        where = f"kubeconfig {self.source}: user {self.user.name!r}"
        acting, uid = fields.get("as"), fields.get("as-uid")
        groups, extra = fields.get("as-groups") or [], fields.get("as-user-extra") or {}
        if acting is not None and not isinstance(acting, str):
            raise KubeconfigError(f"{where}: as must be a string (a user name)")
        if uid is not None and not isinstance(uid, str):
            raise KubeconfigError(f"{where}: as-uid must be a string")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise KubeconfigError(f"{where}: as-groups must be a list of strings")
        if not isinstance(extra, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(i, str) for i in v)
            for k, v in extra.items()
        ):
            raise KubeconfigError(f"{where}: as-user-extra must map strings to lists of strings")
        if not acting:
            if uid or groups or extra:
                raise KubeconfigError(
                    f"{where}: requesting uid, groups or user-extra without impersonating a "
                    f"user; {IMPERSONATION_FIX}"
                )
            return ()
        headers = [("Impersonate-User", acting)]
        if uid:
            headers.append(("Impersonate-Uid", uid))
        headers += [("Impersonate-Group", group) for group in groups]
        for key, values in extra.items():
            headers += [(f"Impersonate-Extra-{header_key_escape(key)}", v) for v in values]
        return tuple(headers)

    @property
    def needs_plugin(self) -> bool:
        """The user authenticates through an exec plugin or auth provider and has no token or
        client certificate of its own (client-go tries those first too)."""
        own = ("token", "tokenFile", "client-certificate", "client-certificate-data")
        plugin = "exec" in self.user.fields or "auth-provider" in self.user.fields
        return plugin and not any(self.user.fields.get(key) for key in own)

    def plugin_unavailable(self) -> str | None:
        """Why this kubeconfig cannot work here — its user needs a plugin, and the official
        client that runs one (an optional extra) is not installed — or None. Asked at start:
        without it the sidecar retried "cannot load the Kubernetes client configuration" for
        ever. Looks the package up without importing it (that costs most of a second)."""
        if not self.needs_plugin:
            return None
        import importlib.util

        try:
            found = importlib.util.find_spec("kubernetes") is not None
        except (ImportError, ValueError):  # ValueError: blocked in sys.modules
            found = False
        if found:
            return None
        kind = "exec plugin" if "exec" in self.user.fields else "auth-provider"
        return f"its user authenticates with an {kind}; {EXEC_FIX}"

    def connection(self, environ: Mapping[str, str] | None = None) -> Connection:
        environ = os.environ if environ is None else environ
        cluster, user = self.cluster.fields, self.user.fields
        server = str(cluster["server"]).rstrip("/")
        try:
            context: ssl.SSLContext | bool = True
            if server.startswith("https:"):
                context = tls_context(
                    ca_file=self._path(self.cluster, "certificate-authority"),
                    ca_data=self._data(cluster, "certificate-authority-data"),
                    insecure=cluster.get("insecure-skip-tls-verify") is True,
                    cert_file=self._path(self.user, "client-certificate"),
                    key_file=self._path(self.user, "client-key"),
                    cert_data=self._data(user, "client-certificate-data"),
                    key_data=self._data(user, "client-key-data"),
                )
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(f"kubeconfig {self.source}: TLS settings: {exc}") from exc
        credentials: Credentials = NoCredentials()
        if user.get("tokenFile"):
            # As client-go: the file is the source, re-read every minute; a token beside it is
            # what is sent until the file gives one.
            credentials = TokenFile(
                Path(self._path(self.user, "tokenFile") or ""),
                fallback=str(user["token"]) if user.get("token") else None,
            )
        elif user.get("token"):
            credentials = StaticHeader(f"Bearer {user['token']}")
        elif user.get("username") is not None and user.get("password") is not None:
            pair = f"{user['username']}:{user['password']}".encode()
            credentials = StaticHeader("Basic " + base64.b64encode(pair).decode())
        proxy = self.proxy()
        return Connection(
            server=server,
            ssl=context,
            credentials=credentials,
            server_hostname=cluster.get("tls-server-name") or None,
            proxy=proxy if proxy is not None else environment_proxy(server, environ),
            namespace=self.namespace,
            impersonation=self.impersonation(),
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


def _check_booleans(path: Path, section: str, entry: _Entry) -> None:
    """A boolean field must be a YAML boolean: ``bool("false")`` is true, and a quoted
    ``"false"`` must not turn certificate checks off."""
    for key in BOOLEANS.get(section, ()):
        value = entry.fields.get(key)
        if value is not None and not isinstance(value, bool):
            kind = section.rstrip("s")
            raise KubeconfigError(
                f"kubeconfig {path}: {kind} {entry.name!r}: {key} must be true or false "
                f"(unquoted), not {value!r}"
            )


_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def header_key_escape(key: str) -> str:
    """An extra's key in a header name, as client-go writes it: every byte that is not an HTTP
    token character, and ``%`` itself, percent-encoded."""
    return "".join(
        chr(byte) if chr(byte) in _TOKEN_CHARS and byte != ord("%") else f"%{byte:02X}"
        for byte in key.encode()
    )


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

    async def refresh(self) -> bool:
        """After a ``401``: run the refresh hook now (it runs the plugin again once the
        credential expired); True if the header changed."""
        hook = self.configuration.refresh_api_key_hook
        if hook is None:
            return False
        before = self._header()
        async with self._lock:
            await asyncio.to_thread(hook, self.configuration)
            self._checked = time.monotonic()
        return self._header() != before

    def __repr__(self) -> str:
        return "PluginCredentials(***)"


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
    proxy = config.proxy()
    return Connection(
        server=server,
        ssl=context,
        credentials=_PluginCredentials(configuration),
        server_hostname=getattr(configuration, "tls_server_name", None) or None,
        proxy=proxy if proxy is not None else environment_proxy(server, os.environ),
        namespace=config.namespace,
        impersonation=config.impersonation(),
    )
