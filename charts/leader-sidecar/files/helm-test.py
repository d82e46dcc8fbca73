# `helm test` of the leader-sidecar chart (templates/tests/): asks every replica's public
# /leader and the leader Service, and passes only when exactly one replica leads, every other
# replica names it as the holder, and the leader Service reaches that replica and no other.
# It retries until --timeout, because a hand-over or a just-created DNS record is briefly
# inconsistent; the last round's problems are printed when it gives up.
#
# Standard library only: it runs with the sidecar image's python3 (`python3 -c`), and the
# chart's tests run this same file against real sidecar processes.
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any

Answer = tuple[int | None, dict[str, Any] | None, str]  # status, JSON body, error


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="leader-sidecar-helm-test",
        description="Exactly one replica leads, and the leader Service reaches it.",
    )
    parser.add_argument(
        "--replicas-dns",
        metavar="HOST:PORT",
        help="a name resolving to every replica (a headless Service); PORT is the public port",
    )
    parser.add_argument(
        "--replica",
        metavar="HOST:PORT",
        action="append",
        default=[],
        help="one replica's public listener (repeatable)",
    )
    parser.add_argument(
        "--service", metavar="HOST:PORT", help="the leader Service's port to the sidecar"
    )
    parser.add_argument(
        "--expect-replicas", type=int, default=0, help="replicas there must be (0: any, >= 1)"
    )
    parser.add_argument(
        "--service-requests",
        type=int,
        default=5,
        help="requests through the Service per round (each may reach a different endpoint)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds")
    args = parser.parse_args(argv)
    if not args.replicas_dns and not args.replica:
        parser.error("name the replicas: --replicas-dns or --replica")
    return args


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/leader" if ":" in host else f"http://{host}:{port}/leader"


def replica_urls(args: argparse.Namespace) -> list[str]:
    """Every replica's /leader URL: the DNS name's addresses, then the explicit ones."""
    urls: list[str] = []
    if args.replicas_dns:
        host, port = split_host_port(args.replicas_dns)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            infos = []
        for info in infos:
            address = url(str(info[4][0]), port)
            if address not in urls:
                urls.append(address)
    urls += [url(*split_host_port(address)) for address in args.replica]
    return urls


def ask(address: str) -> Answer:
    try:
        with urllib.request.urlopen(address, timeout=3) as response:
            return response.status, json.load(response), ""
    except urllib.error.HTTPError as error:  # 503: a follower; the body is the same JSON
        try:
            return error.code, json.load(error), ""
        except ValueError:
            return error.code, None, "not JSON"
    except (OSError, ValueError) as error:
        return None, None, str(error)


def claims_leadership(status: int | None, body: dict[str, Any] | None) -> bool:
    return status == 200 and body is not None and body.get("leader") is True


def check(args: argparse.Namespace) -> tuple[list[str], str]:
    """One round: the problems found (none: the test passes) and a one-line summary."""
    problems: list[str] = []
    urls = replica_urls(args)
    if not urls:
        return [f"no replica found ({args.replicas_dns} resolves to nothing)"], ""
    if args.expect_replicas and len(urls) != args.expect_replicas:
        problems.append(f"expected {args.expect_replicas} replicas, found {len(urls)}: {urls}")
    answers = {address: ask(address) for address in urls}
    leaders: list[tuple[str, Any]] = []
    for address, (status, body, error) in answers.items():
        if status is None or body is None:
            problems.append(f"{address}: no /leader answer ({status or error})")
        elif claims_leadership(status, body):
            leaders.append((address, body.get("identity")))
        elif status == 200 or body.get("leader") is True:
            problems.append(f"{address}: status {status} contradicts leader={body.get('leader')}")
    if len(leaders) != 1:
        problems.append(f"{len(leaders)} replicas claim to lead: {leaders}")
        return problems, ""
    leader_address, leader = leaders[0]
    for address, (_, body, _) in answers.items():
        if body and address != leader_address and body.get("holder") != leader:
            problems.append(f"{address}: names {body.get('holder')!r} as holder, not {leader!r}")
    if args.service:
        service = url(*split_host_port(args.service))
        for _ in range(args.service_requests):
            status, body, error = ask(service)
            if body is None or not claims_leadership(status, body):
                who = body.get("identity") if body else error
                problems.append(f"the leader Service reached a non-leader: {status} from {who}")
            elif body.get("identity") != leader:
                problems.append(
                    f"the leader Service reached {body.get('identity')!r}, which claims to lead; "
                    f"the replicas say {leader!r} leads"
                )
    term = (answers[leader_address][1] or {}).get("term")
    return problems, f"{leader} leads (term {term}) among {len(urls)} replicas"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    deadline = time.monotonic() + args.timeout
    while True:
        problems, summary = check(args)
        if not problems:
            reached = "; the leader Service reaches it" if args.service else ""
            print(f"PASS: {summary}{reached}")
            return 0
        if time.monotonic() >= deadline:
            print("FAIL:\n  " + "\n  ".join(problems))
            return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
