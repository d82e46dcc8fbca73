"""Who may call ``POST /leader/release``: the app next door, not a web page.

A browser sends a "simple" cross-site POST (``Content-Type: text/plain``, no custom header)
without asking first, and after DNS rebinding a page's own origin resolves to 127.0.0.1. So a
release must (1) carry a JSON content type or the ``X-Leader-Sidecar`` header — either makes a
browser ask first (CORS preflight), and we never say yes; (2) come without an ``Origin`` or
from a loopback one; (3) name this listener's own address or ``localhost`` in ``Host``.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

from aiohttp import web

RELEASE_HEADER = "X-Leader-Sidecar"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def release_refusal(request: web.Request) -> str | None:
    """None when the request may release; else the one-line reason for the 403."""
    if request.content_type != "application/json" and not request.headers.get(RELEASE_HEADER):
        return (
            f"a release needs the header '{RELEASE_HEADER}: release' or "
            "'Content-Type: application/json'"
        )
    origin = request.headers.get("Origin")
    if origin is not None and not _is_loopback_origin(origin):
        return "a release from a web page on another origin is refused"
    if not _is_own_host(request):
        return "the Host header must name this listener's address or localhost"
    return None


def _is_loopback_origin(origin: str) -> bool:
    try:
        parsed = urllib.parse.urlsplit(origin)
        host = parsed.hostname
    except ValueError:
        return False
    return parsed.scheme in ("http", "https") and host is not None and _is_loopback(host)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_own_host(request: web.Request) -> bool:
    """``Host`` names the address this connection arrived on, or ``localhost``; its port, if
    any, is the one the connection arrived on."""
    header = request.headers.get("Host")
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not header or not sockname:
        return False
    try:
        parsed = urllib.parse.urlsplit("//" + header)
        name, port = parsed.hostname, parsed.port
    except ValueError:
        return False
    if name is None or (port is not None and port != sockname[1]):
        return False
    if name.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name) == ipaddress.ip_address(sockname[0])
    except ValueError:
        return False
