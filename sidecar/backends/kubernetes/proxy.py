"""Which proxy a request to the API server goes through: the kubeconfig's ``proxy-url`` if it
has one, else ``HTTPS_PROXY``/``HTTP_PROXY`` unless ``NO_PROXY`` exempts the server, exactly as
kubectl and client-go decide it (Go's ``golang.org/x/net/http/httpproxy``):

* ``HTTPS_PROXY`` (or ``https_proxy``) for an ``https://`` server, ``HTTP_PROXY`` (or
  ``http_proxy``) for ``http://``; the upper-case name wins when both are set and not empty. A
  value without a scheme (``proxy.corp:3128``) means ``http://``.
* ``localhost`` and loopback addresses are never proxied.
* ``NO_PROXY`` (or ``no_proxy``), comma-separated: ``*`` (nothing is proxied), an IP address
  (``10.0.0.1``, ``[::1]``), a CIDR (``10.0.0.0/8``), a domain name that matches itself and
  every subdomain (``corp.example`` and ``*.corp.example`` alike; ``.corp.example`` matches
  only subdomains); an address or domain may carry a port (``corp.example:6443``) and then
  matches only that port. Domains never match a server given by IP address, and CIDRs never
  match a name (no DNS lookups). Entries that do not parse are ignored, as Go ignores them.

aiohttp speaks to ``http://`` and ``https://`` proxies; a SOCKS proxy, which Go's transport
supports, is refused with the reason rather than silently bypassed. Credentials in the proxy
URL (``http://user:pass@proxy:3128``) become its ``Proxy-Authorization`` header.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import urllib.parse
from collections.abc import Mapping

from sidecar.redact import redact_url

DEFAULT_PORTS = {"http": "80", "https": "443"}
SUPPORTED_SCHEMES = ("http", "https")


class ProxyError(ValueError):
    """A proxy setting that cannot be used; the message names the setting and the fix."""

    def __init__(self, setting: str, value: str, reason: str) -> None:
        super().__init__(f"{setting}={value}: {reason}")
        self.setting = setting
        self.value = value  # credentials hidden
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Proxy:
    """A proxy to send requests through: its URL without credentials, and the header that
    carries them (None without)."""

    url: str
    authorization: str | None = None

    def __repr__(self) -> str:
        hidden = ", authorization='Basic ***'" if self.authorization else ""
        return f"Proxy(url={self.url!r}{hidden})"

    @property
    def headers(self) -> dict[str, str] | None:
        """For the proxy itself: the ``CONNECT`` of an ``https://`` server's tunnel."""
        return {"Proxy-Authorization": self.authorization} if self.authorization else None

    def request_headers(self, server: str) -> dict[str, str]:
        """For the request: to an ``http://`` server it goes to the proxy as it is, so the
        credentials go with it; never inside an ``https://`` tunnel (the server would get
        them)."""
        if self.authorization and server.lower().startswith("http://"):
            return {"Proxy-Authorization": self.authorization}
        return {}


def parse_proxy(value: str, setting: str) -> Proxy:
    """A proxy URL as Go reads it (a bare ``host:port`` means ``http://``). Raises
    `ProxyError` naming ``setting`` for a scheme aiohttp cannot speak or no host."""
    text = value.strip()
    parts = urllib.parse.urlsplit(text)
    if not parts.scheme or not parts.netloc:
        parts = urllib.parse.urlsplit("http://" + text)
    shown = redact_url(text)
    if parts.scheme.lower() not in SUPPORTED_SCHEMES:
        raise ProxyError(
            setting,
            shown,
            f"a {parts.scheme} proxy is not supported; use an http:// or https:// proxy",
        )
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host:
        raise ProxyError(setting, shown, "not a proxy URL; give http://host:port")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        pair = f"{user}:{password}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode()
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return Proxy(f"{parts.scheme.lower()}://{netloc}", authorization)


def from_environment(server: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy the environment names for requests to ``server``, or None. Raises
    `ProxyError` for a proxy variable that applies and cannot be used."""
    scheme = urllib.parse.urlsplit(server).scheme.lower()
    names = {"https": ("HTTPS_PROXY", "https_proxy"), "http": ("HTTP_PROXY", "http_proxy")}
    if scheme not in names:
        return None
    setting, value = _first_set(environ, names[scheme])
    if not value:
        return None
    if not use_proxy(server, _first_set(environ, ("NO_PROXY", "no_proxy"))[1]):
        return None
    return parse_proxy(value, setting)


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str]:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return names[0], ""


def use_proxy(server: str, no_proxy: str) -> bool:
    """Whether a request to ``server`` goes through a proxy, given ``NO_PROXY``."""
    parts = urllib.parse.urlsplit(server)
    host = _ascii((parts.hostname or "").strip().lower())
    try:
        port = str(parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), ""))
    except ValueError:
        return False
    if not host or host == "localhost":
        return False
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return False
    return not any(rule.matches(host, port, ip) for rule in _rules(no_proxy))


@dataclasses.dataclass(frozen=True)
class _Rule:
    """One ``NO_PROXY`` entry: everything, a network, an address (and port), or a domain."""

    everything: bool = False
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    domain: str = ""  # with a leading dot
    itself_too: bool = False  # the domain without a leading dot matches itself as well
    port: str = ""

    def matches(
        self, host: str, port: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    ) -> bool:
        if self.everything:
            return True
        if self.network is not None:
            return ip is not None and ip in self.network
        if self.address is not None:
            return ip is not None and ip == self.address and self.port in ("", port)
        if ip is not None:
            return False
        named = host.endswith(self.domain) or (self.itself_too and host == self.domain[1:])
        return named and self.port in ("", port)


def _rules(no_proxy: str) -> list[_Rule]:
    rules = []
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return [_Rule(everything=True)]
        if "/" in entry:
            # Not a CIDR: ignored, as Go ignores it (a domain cannot hold a slash).
            with contextlib.suppress(ValueError):
                rules.append(_Rule(network=ipaddress.ip_network(entry, strict=False)))
            continue
        host, port = _split_host_port(entry)
        if host is None:
            continue
        address = _ip(host)
        if address is not None:
            rules.append(_Rule(address=address, port=port))
            continue
        if host.startswith("*."):
            host = host[1:]
        itself_too = not host.startswith(".")
        domain = _ascii(host if not itself_too else "." + host)
        rules.append(_Rule(domain=domain, itself_too=itself_too, port=port))
    return rules


def _split_host_port(entry: str) -> tuple[str | None, str]:
    """``host:port``, ``[v6]:port`` or a bare host (a bare IPv6 address included)."""
    if entry.startswith("["):
        end = entry.find("]")
        if end == -1:
            return None, ""
        rest = entry[end + 1 :]
        return entry[1:end] or None, rest[1:] if rest.startswith(":") else ""
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host or None, port
    return entry, ""


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _ascii(host: str) -> str:
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode()
    except UnicodeError:
        return host
