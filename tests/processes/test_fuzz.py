"""A bounded fuzz run against two real sidecars: malformed requests, odd ``wait=`` values,
header floods, garbage and cross-site release attempts, from eight connections at once on
both listeners. Whatever arrives, the leader keeps leading under the same term, the other
replica never leads, every request is answered or closed within seconds, and nothing is
logged above debug level for it (issue 12)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import raw_http
from tests.support.sidecars import SidecarProcess, observing, sidecars

pytestmark = pytest.mark.slow

SEED = 12
WORKERS = 8
SECONDS = 6.0  # three leases: a stalled loop would have cost the leader its lease
MAX_REQUESTS = 4000


def odd_wait(rng: random.Random) -> bytes:
    value = rng.choice(
        [
            lambda: "1" + "+" * rng.randint(100, 7000) + "x",  # the quadratic pattern
            lambda: "1" + "%20" * rng.randint(100, 2000) + "s",
            lambda: "%D9%A3",  # ARABIC-INDIC DIGIT THREE
            lambda: "%EF%BC%95s",  # FULLWIDTH DIGIT FIVE
            lambda: rng.choice(["0s", "0", "-1", "1e309", "nan", "inf", "%00", "1_0", ".", ""]),
            lambda: "9" * rng.randint(1, 400),
            lambda: "".join(rng.choices("0123456789.+ msh%-_eE", k=rng.randint(1, 64))),
        ]
    )()
    return raw_http.get(f"/leader?wait={value}", 'If-None-Match: "stale"')


def malformed(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"G\x00ET /leader HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /leader\r\n\r\n",
            b"GET /leader HTTP/9.9\r\nHost: x\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nNo colon here\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            b"GET /leader HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"POST /leader/release HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /leader HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"GET /leader?wait=%ZZ HTTP/1.1\r\nHost: x\r\nIf-None-Match: x\r\n\r\n",
            b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
    )


def header_flood(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        headers = [f"X-Flood-{n}: {'v' * rng.randint(1, 100)}" for n in range(rng.randint(65, 300))]
    else:
        headers = [f"X-Big: {'b' * rng.randint(8200, 20000)}"]
    return raw_http.get("/leader", *headers)


def garbage(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randint(1, 3000))


def release_from_a_page(rng: random.Random) -> bytes:
    origin = rng.choice(["http://evil.example", "null", "https://127.0.0.1.evil.example"])
    host = rng.choice(["127.0.0.1", "evil.example:4040", "localhost.evil.example"])
    return (
        f"POST /leader/release HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n"
        "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
    ).encode()


KINDS: list[Callable[[random.Random], bytes]] = [
    odd_wait,
    odd_wait,
    malformed,
    header_flood,
    garbage,
    release_from_a_page,
]


async def fire(address: str, request: bytes) -> str:
    """``"200"`` … ``"503"``, ``"closed"`` (the server hung up), or ``"hung"``."""
    try:
        reader, writer = await raw_http.connect(address)
    except OSError:
        return "refused"
    try:
        writer.write(request)
        await writer.drain()
        answer = await raw_http.read_head(reader, 5.0)
        return str(answer.status)
    except TimeoutError:
        return "hung"
    except (ConnectionError, OSError, ValueError, IndexError):
        return "closed"
    finally:
        writer.close()


async def fuzz(leader: SidecarProcess, rng: random.Random) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + SECONDS
    sent = 0

    async def worker(seed: int) -> None:
        nonlocal sent
        local_rng = random.Random(seed)
        while time.monotonic() < deadline and sent < MAX_REQUESTS:
            sent += 1
            kind = local_rng.choice(KINDS)
            address = local_rng.choice([leader.local, leader.public])
            outcomes[f"{kind.__name__}:{await fire(address, kind(local_rng))}"] += 1

    await asyncio.gather(*(worker(rng.randrange(2**32)) for _ in range(WORKERS)))
    return outcomes


async def test_a_fuzzing_client_on_both_listeners_moves_nothing(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'leases.db'}"
    with sidecars(["a", "b"], store, lease_duration="2s") as procs:
        async with observing(procs) as observer:
            before = await observer.leader()
            leader = next(p for p in procs if p.name == before.name)
            other = next(p for p in procs if p is not leader)
            logged_before = len(leader.logs)
            outcomes = await fuzz(leader, random.Random(SEED))
            after = await observer.leader(after=time.time())

            print(dict(sorted(outcomes.items())))
            assert sum(outcomes.values()) > 200, "too few requests to mean anything"
            assert not [k for k in outcomes if k.endswith((":hung", ":refused"))], outcomes
            assert not [k for k in outcomes if k.endswith(":500")], outcomes
            assert not [k for k in outcomes if k.startswith("release_from_a_page:200")]
            assert (after.name, after.term) == (before.name, before.term)
            assert not [s for s in observer.samples if s.name == other.name and s.leader]
            logged = leader.logs[logged_before:]
            # The candidates' own bookkeeping (who is alive) is not the requests' doing.
            noisy = [
                e
                for e in logged
                if e.get("level") != "debug" and e.get("logger") != "sidecar.candidates"
            ]
            # At most the one throttled info line about refused releases.
            assert [e["msg"] for e in noisy] in ([], ["release refused"]), noisy[:3]
            malformed = [e for e in logged if e.get("msg") == "malformed request refused"]
            # One line per listener per 10 s at most, however many arrived.
            assert len(malformed) <= 2 * (int(SECONDS // 10) + 1), len(malformed)
