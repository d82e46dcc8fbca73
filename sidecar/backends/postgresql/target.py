"""Where the leases live: the ``--store postgresql://…`` URL, checked at start-up so a mistake
stops the sidecar with a line naming what is wrong, and described for logs without secrets.

The URL is libpq's (and asyncpg's, which connects): ``postgresql://[user[:password]@]host
[:port][,host[:port]…][/dbname][?param=value&…]``. The password may also come from
``PGPASSWORD`` or a password file (``passfile=``, ``PGPASSFILE``, ``~/.pgpass``), as with psql.
"""

from __future__ import annotations

import dataclasses
import ssl
import urllib.parse
from pathlib import Path

from sidecar.backends.endpoints import is_host_port, port_ok
from sidecar.backends.postgresql.names import INSTALL, SCHEMES
from sidecar.backends.tls import TlsFileError, ca_context, load_pair
from sidecar.config_error import ConfigError

# The parameters asyncpg understands in a URL; anything else it would send to the server as a
# setting, which fails every connection later ("unrecognized configuration parameter").
PARAMETERS = (
    "host", "port", "dbname", "user", "password", "passfile", "application_name",
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs",
)  # fmt: skip
SECRET_PARAMETERS = ("password", "sslpassword")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# The sidecar writes: it must reach a primary. "read-write" is the default here (libpq's is
# "any", which may settle on a standby and fail every write until the next reconnect).
WRITABLE_SESSION_ATTRS = ("read-write", "primary", "any")
FILE_PARAMETERS = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "passfile")


DRIVER = "asyncpg"


NO_DRIVER = f"the PostgreSQL store needs its driver, {DRIVER}, which is not installed: {INSTALL}"


def driver_absent() -> str | None:
    """Why the store's driver cannot be used (it is an optional extra: a plain ``pip install
    .`` has none), as the fix to type; None when it is installed. Finds it without importing
    it (~20 ms): the configuration is read before the listeners answer, and the store imports
    it after (`missing_driver`)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(DRIVER) is not None
    except (ImportError, ValueError):  # a parent package that fails, a module without spec
        found = False
    return None if found else NO_DRIVER


def missing_driver() -> str | None:
    """`driver_absent`, by importing the driver: only a real import proves it works (a
    half-installed package fails here too)."""
    import importlib

    try:
        importlib.import_module(DRIVER)
    except ImportError:
        return NO_DRIVER
    return None


def _bad(url: str, allowed: str) -> ConfigError:
    return ConfigError("--store", url, allowed)


@dataclasses.dataclass(frozen=True)
class PostgresTarget:
    """The URL to connect with (secrets included: never log it) and what to show instead."""

    url: str = dataclasses.field(repr=False)
    hosts: tuple[str, ...]
    database: str
    user: str
    params: tuple[tuple[str, str], ...]

    @property
    def target_session_attrs(self) -> str:
        return dict(self.params).get("target_session_attrs", "read-write")

    @property
    def tls(self) -> bool:
        return dict(self.params).get("sslmode", "prefer") not in ("disable", "allow", "prefer")

    def describe(self) -> str:
        """The URL without its password (nor ``password=`` / ``sslpassword=``), for logs."""
        user = f"{self.user}@" if self.user else ""
        query = "&".join(
            f"{key}={'***' if key in SECRET_PARAMETERS else value}" for key, value in self.params
        )
        return f"postgresql://{user}{','.join(self.hosts)}/{self.database}" + (
            f"?{query}" if query else ""
        )


def parse_target(url: str) -> PostgresTarget:
    """Check ``url``; raises `ConfigError` (its value shown redacted) naming the problem."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in SCHEMES:
        raise _bad(url, "not a postgresql:// URL")
    if parsed.fragment:
        raise _bad(url, "takes no #fragment")
    userinfo, _, hostlist = parsed.netloc.rpartition("@")
    user = urllib.parse.unquote(userinfo.partition(":")[0])
    hosts = tuple(h for h in hostlist.split(",") if h) if hostlist else ()
    for host in hosts:
        if not _host_ok(host):
            raise _bad(url, f"{host!r} is not HOST or HOST:PORT (a port from 1 to 65535)")
    try:
        pairs = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=False)
    except ValueError as exc:
        raise _bad(url, f"its query cannot be read: {exc}") from None
    seen: set[str] = set()
    for key, value in pairs:
        if key not in PARAMETERS:
            raise _bad(
                url,
                f"?{key}= is not a parameter the PostgreSQL store understands; use one of "
                + ", ".join(PARAMETERS),
            )
        if key in seen:
            raise _bad(url, f"gives ?{key}= twice")
        seen.add(key)
        if key == "sslmode" and value not in SSL_MODES:
            raise _bad(url, f"?sslmode= must be one of {', '.join(SSL_MODES)}")
        if key == "target_session_attrs" and value not in WRITABLE_SESSION_ATTRS:
            raise _bad(
                url,
                "?target_session_attrs= must be read-write (the default), primary or any: the "
                "sidecar writes, so it must reach the primary",
            )
        if key in FILE_PARAMETERS and value and not Path(value).expanduser().is_file():
            raise _bad(url, f"?{key}={value}: no such file; give the path of a readable file")
        if key == "port" and not all(port_ok(p) for p in value.split(",")):
            raise _bad(url, "?port= must be a port from 1 to 65535 (or one per host)")
    if ("sslcert" in seen) != ("sslkey" in seen):
        raise _bad(url, "?sslcert= and ?sslkey= go together; give both or neither")
    params = tuple((k, v) for k, v in pairs)
    query_hosts = dict(params).get("host")
    shown_hosts = hosts or ((query_hosts,) if query_hosts else ("localhost",))
    database = urllib.parse.unquote(parsed.path.lstrip("/")) or dict(params).get("dbname", "")
    target = PostgresTarget(
        url=url,
        hosts=shown_hosts,
        database=database or user or "postgres",
        user=user or dict(params).get("user", ""),
        params=params,
    )
    _check_tls_files(target)
    return target


def _host_ok(text: str) -> bool:
    return is_host_port(text, bare_ipv6=False)


def _check_tls_files(target: PostgresTarget) -> None:
    """Load the CA and the client certificate now, so a wrong file stops the sidecar at
    start-up naming the parameter, instead of failing every connection later."""
    params = dict(target.params)
    rootcert = params.get("sslrootcert")
    if rootcert and rootcert != "system":
        try:
            ca_context(str(Path(rootcert).expanduser()))
        except TlsFileError as exc:
            raise _bad(target.url, f"?sslrootcert={rootcert} {exc}") from None
    cert, key = params.get("sslcert"), params.get("sslkey")
    if cert and key:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            load_pair(
                context,
                str(Path(cert).expanduser()),
                str(Path(key).expanduser()),
                password=params.get("sslpassword") or None,
            )
        except TlsFileError as exc:
            raise _bad(
                target.url,
                f"?sslcert={cert} with ?sslkey={key} cannot be loaded as a PEM certificate and "
                f"its private key: {exc}",
            ) from None
