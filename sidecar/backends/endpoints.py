"""``host:port`` as the stores' URLs spell it, parsed once for every store: ``host``,
``host:port``, ``[v6]``, ``[v6]:port``, and a bare IPv6 address where a store allows one."""

from __future__ import annotations


def split_host_port(text: str, default_port: int, *, bare_ipv6: bool = True) -> tuple[str, int]:
    """``(host, port)``, ``default_port`` when none is given; raises ValueError when ``text``
    is not one of the forms above with a port from 1 to 65535. ``bare_ipv6``: an address with
    several colons and no brackets is a host (``::1``), not a host and a port."""
    host, port = text, None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(text)
        port = rest[1:] if rest else None
    elif text.count(":") == 1 or (":" in text and not bare_ipv6):
        host, _, port = text.partition(":")
    if not host or (port is not None and not port_ok(port)):
        raise ValueError(text)
    return host, int(port) if port is not None else default_port


def port_ok(port: str) -> bool:
    return port.isascii() and port.isdigit() and 0 < int(port) <= 65535


def is_host_port(text: str, *, bare_ipv6: bool = True) -> bool:
    try:
        split_host_port(text, 0, bare_ipv6=bare_ipv6)
    except ValueError:
        return False
    return True


def join_host(host: str, port: int) -> str:
    """The inverse of `split_host_port`: brackets around an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def netloc_ok(netloc: str) -> bool:
    """A URL's ``[user[:password]@]host[:port][,host[:port]…]`` names something, and each
    host in it is well formed (the store parses it whole when it connects)."""
    hosts = [part for part in netloc.rpartition("@")[2].split(",") if part]
    return bool(netloc) and all(is_host_port(part) for part in hosts)
