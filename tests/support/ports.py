"""Loopback ports for the servers the tests start."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
