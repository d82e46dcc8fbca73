"""Several hosts in one URL, raced: a host that hangs never keeps the sidecar from the others.

asyncpg tries a URL's hosts one after the other under one timeout for them all, so a primary
that hangs (stopped, or cut off by a partition whose packets vanish) uses up the whole timeout
and the next host — the standby promoted in its place — is never asked: every connection fails
for as long as the old primary hangs, and nobody leads. libpq bounds each host by its own
``connect_timeout``; here each host gets a head start (``stagger``) after which the next one is
tried beside it, as "happy eyeballs" does for addresses (RFC 8305). The first connection that
suits ``target_session_attrs`` wins, in any order; every other one is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from sidecar.backends.endpoints import split_host_port
from sidecar.backends.postgresql.target import PostgresTarget

Connection = TypeVar("Connection")

DEFAULT_PORT = 5432


def addresses(target: PostgresTarget) -> list[tuple[str, int]]:
    """``(host, port)`` of each host the URL names, in its order: ``host1:port1,host2…`` in the
    URL, or ``?host=h1,h2&port=p1,p2``. A host without a port takes ``?port=`` (one for all,
    or the one at its place) or 5432."""
    params = dict(target.params)
    ports = [p for p in params.get("port", "").split(",") if p]
    result = []
    for index, text in enumerate(_host_texts(target, params)):
        host, port = split_host_port(text, 0, bare_ipv6=False)  # 0: no port of its own
        if not port:
            port = int(ports[index] if index < len(ports) else ports[0]) if ports else DEFAULT_PORT
        result.append((host, port))
    return result


def _host_texts(target: PostgresTarget, params: dict[str, str]) -> list[str]:
    query_hosts = [h for h in params.get("host", "").split(",") if h]
    if query_hosts and list(target.hosts) == [params["host"]]:
        return query_hosts
    return list(target.hosts)


async def first_usable(
    connect: Callable[[tuple[str, int]], Awaitable[Connection]],
    hosts: Sequence[tuple[str, int]],
    *,
    stagger: float,
    close: Callable[[Connection], None],
) -> Connection:
    """The first of ``connect(host)`` to succeed, each host started ``stagger`` seconds after
    the one before it (at once when that one has failed already). Raises the first host's
    error when every host failed. Attempts still running when one wins are cancelled, and a
    connection that arrives too late is closed."""
    attempts: list[asyncio.Future[Connection]] = []
    errors: dict[int, BaseException] = {}
    winner: Connection | None = None
    try:
        for index, host in enumerate(hosts):
            attempts.append(asyncio.ensure_future(connect(host)))
            last = index == len(hosts) - 1
            winner = await _first_success(attempts, errors, None if last else stagger)
            if winner is not None:
                return winner
        raise errors[min(errors)]
    finally:
        for attempt in attempts:
            if attempt.done():
                _close_unless(attempt, winner, close)
            else:
                attempt.cancel()
                attempt.add_done_callback(lambda done: _close_unless(done, None, close))


async def _first_success(
    attempts: list[asyncio.Future[Connection]],
    errors: dict[int, BaseException],
    timeout: float | None,
) -> Connection | None:
    """Waits until an attempt succeeds (returned), every attempt has failed, or ``timeout``
    passed with some still running (None both times)."""
    loop = asyncio.get_running_loop()
    until = None if timeout is None else loop.time() + timeout
    while True:
        for index, attempt in enumerate(attempts):
            if attempt.done() and index not in errors:
                if attempt.cancelled():
                    errors[index] = asyncio.CancelledError()
                elif (error := attempt.exception()) is not None:
                    errors[index] = error
                else:
                    return attempt.result()
        running = [a for a in attempts if not a.done()]
        if not running:
            return None
        left = None if until is None else until - loop.time()
        if left is not None and left <= 0:
            return None
        await asyncio.wait(running, timeout=left, return_when=asyncio.FIRST_COMPLETED)


def _close_unless(
    done: asyncio.Future[Connection], winner: Connection | None, close: Callable[[Connection], None]
) -> None:
    """Closes the connection ``done`` brought, unless it is the winner."""
    if done.cancelled() or done.exception() is not None or done.result() is winner:
        return
    with contextlib.suppress(Exception):
        close(done.result())
