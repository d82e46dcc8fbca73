"""``leader-sidecar status`` and ``leader-sidecar transfer``: the operator's commands.

``status`` reads the store directly, with the same ``--store`` flags as the sidecar, and
prints per lease the holder, term and age of the last renewal, and the candidates — the
``patronictl list`` of this tool. Ages come from the store's wall-clock stamps: information for
humans, never a grant. ``transfer`` asks the local sidecar to hand its lease(s) over.

Everything they print that came from outside — a store record, an answer, an error — goes
through `terminal_text`: a holder or identity carrying an escape sequence, CR/LF or
bytes that are not UTF-8 reaches the operator's terminal escaped (``\\x1b``, ``\\xff``), never
as a screen clear, a window title or a forged row.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sidecar import bounded_json
from sidecar.backends import store_options
from sidecar.backends.base import Candidate, LeaseRecord, NoStore, StoreError, is_hold
from sidecar.config import OPTIONS, Config, load
from sidecar.config_error import ConfigError
from sidecar.hold import DEFAULT_HOLD, HoldRefused, default_who, hold, parse_hold, resume
from sidecar.options import HelpFormatter, Option, Parser, add_options, parse_duration
from sidecar.redact import redact_url, terminal_text
from sidecar.release_guard import RELEASE_HEADER
from sidecar.timing import MAX_LEASE_SECONDS

READ_CONCURRENCY = 32  # store reads in flight at once for a status of many leases
MAX_ANSWER = 1024 * 1024  # bytes of a sidecar's answer `transfer` reads
SHOWN = 200  # characters of an answer that is not what it should be, in the one-line error


def _age(stamp: datetime | None, now: datetime) -> float | None:
    return None if stamp is None else round((now - stamp).total_seconds(), 3)


def _state(record: LeaseRecord | None) -> str:
    if record is None:
        return "none"
    if record.unreadable is not None:
        return "unreadable"  # a record of unknown holder: waited out, then taken over
    if is_hold(record.holder):
        return "on hold"  # an operator's hold: nobody leads until resume or its end
    if record.holder is not None:
        return "held"
    if record.released:
        return f"released to {record.successor}" if record.successor else "released"
    return "lost"  # the store lost the holder (a loss marker): waited out as a loss


def lease_row(name: str, record: LeaseRecord | None, now: datetime) -> dict[str, Any]:
    return {
        "lease": name,
        "holder": record.holder if record else None,
        "term": record.term if record else None,
        "state": _state(record),
        "lease_duration_seconds": record.duration if record else None,
        "seconds_since_renewal": _age(record.renewed_at, now) if record else None,
        "problem": (record.unreadable or record.ignored) if record else None,
        "hold": hold_of(record),
    }


def hold_of(record: LeaseRecord | None) -> dict[str, Any] | None:
    """An operator's hold as ``status`` shows it: who set it, why, and until when (by the
    store's wall clock, for humans: each sidecar times the hold from when it saw it)."""
    if record is None or not is_hold(record.holder):
        return None
    assert record.holder is not None
    who, reason = parse_hold(record.holder)
    start = record.acquired_at or record.renewed_at
    until = start + timedelta(seconds=record.duration) if start is not None else None
    return {
        "by": who,
        "reason": reason,
        "until": until.isoformat().replace("+00:00", "Z") if until is not None else None,
        "duration_seconds": record.duration,
    }


def candidate_row(candidate: Candidate, now: datetime, lease: float) -> dict[str, Any]:
    age = _age(candidate.beat_at, now)
    return {
        "identity": candidate.identity,
        "revision": candidate.revision or None,
        "priority": candidate.priority,
        "leaving": candidate.leaving,
        "app": candidate.app or None,
        "seconds_since_beat": age,
        # By the store's wall clock: a hint for humans; the sidecars judge liveness by versions.
        "stale": age is None or age > lease,
        "holds": 0,
        "unreadable": candidate.unreadable,
    }


async def gather_status(config: Config) -> dict[str, Any]:
    from sidecar.backends import open_client

    client = open_client(config, read_only=True)
    try:
        limit = asyncio.Semaphore(READ_CONCURRENCY)
        timeout = max(5.0, config.timing.request_timeout)

        async def read(name: str) -> LeaseRecord | None:
            async with limit, asyncio.timeout(timeout):
                return await client.lease(name).read()

        names = list(config.lease_names)
        records = await asyncio.gather(*(read(name) for name in names))
        async with asyncio.timeout(timeout):
            candidates = await client.candidates(config.candidate_group).list()
    finally:
        await client.close()
    now = datetime.now(UTC)
    leases = [lease_row(config.ref(n), r, now) for n, r in zip(names, records, strict=True)]
    rows = [candidate_row(c, now, config.timing.lease_duration) for c in candidates]
    holds = {row["identity"]: row for row in rows}
    for lease in leases:
        if lease["holder"] in holds:
            holds[lease["holder"]]["holds"] += 1
    return {
        "store": client.description,
        "group": config.candidate_group,
        "leases": leases,
        "candidates": sorted(rows, key=lambda row: row["identity"]),
    }


def render_table(status: dict[str, Any]) -> str:
    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        return lines

    def text(value: object) -> str:
        return "-" if value is None else terminal_text(value)

    out = [f"store {text(status['store'])}  group {text(status['group'])}", ""]
    out += table(
        ["LEASE", "HOLDER", "TERM", "STATE", "RENEWED (s ago)"],
        [
            [
                text(row["lease"]),
                text(row["holder"]),
                text(row["term"]),
                text(row["state"]),
                text(row["seconds_since_renewal"]),
            ]
            for row in status["leases"]
        ],
    )
    for row in status["leases"]:
        hold = row.get("hold")
        if hold is not None:
            out.append(
                f"lease {text(row['lease'])} is on hold by {text(hold['by'])} until "
                f"{text(hold['until'])}: {text(hold['reason'])} (leader-sidecar resume ends it)"
            )
    out.append("")
    if status["candidates"]:
        out += table(
            ["CANDIDATE", "HOLDS", "APP", "REVISION", "PRIORITY", "BEAT (s ago)", "NOTE"],
            [
                [
                    text(c["identity"]),
                    str(c["holds"]),
                    text(c["app"]),
                    text(c["revision"]),
                    str(c["priority"]),
                    text(c["seconds_since_beat"]),
                    text(_note(c)),
                ]
                for c in status["candidates"]
            ],
        )
    else:
        out.append("no candidates registered")
    return "\n".join(out) + "\n"


def _note(candidate: dict[str, Any]) -> str:
    if candidate["unreadable"]:
        return f"unreadable: {candidate['unreadable']}"
    if candidate["leaving"] and candidate.get("app") == "down":
        return "app down: never handed a lease"
    return "leaving" if candidate["leaving"] else ("stale" if candidate["stale"] else "")


# The sidecar's settings that say where the store and the leases are: `status` takes these
# and every store's own options (and their LEADER_SIDECAR_* variables), not the flags of a
# running sidecar's listeners.
_STORE_FLAGS = (
    "--store", "--lease", "--shards", "--group", "--namespace", "--lease-duration",
    "--request-timeout",
)  # fmt: skip
_STATUS_EPILOG = """\
Every flag above can also be set as LEADER_SIDECAR_<FLAG>, as for the sidecar itself, so in
a sidecar's container `leader-sidecar status` alone reads that sidecar's store and leases.

exit status: 0 printed, 1 the store did not answer or is not there, 2 bad usage or
configuration.
"""
_TRANSFER_EPILOG = """\
The sidecar demotes, then hands each lease to the successor in one store write; the answer
is the sidecar's JSON ({"transferred": [leases], "successor": identity}).

exit status: 0 handed over, 1 refused by the sidecar or the sidecar not reached, 2 bad usage.
"""


def status_options() -> list[Option]:
    own = set(store_options())
    return [o for o in OPTIONS if o.flag in _STORE_FLAGS or o in own]


def status_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar status",
        description="Print, per lease, the holder, term, state and age of the last renewal, and\n"
        "the group's candidates, read from the store itself (no sidecar is asked).",
        epilog=_STATUS_EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="a table for people (default) or JSON for programs",
    )
    add_options(parser, status_options())
    return parser


def transfer_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar transfer",
        description="Ask the sidecar on this host (POST /leader/transfer) to hand its lease(s) to\n"
        "another replica now.",
        epilog=_TRANSFER_EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--to",
        metavar="ID|any",
        default="any",
        help="the successor: an identity, a pod name (the identity without its suffix), or "
        "'any' for the best live replica (default any)",
    )
    parser.add_argument(
        "--lease",
        metavar="NAME",
        default="",
        help="the lease to hand over (default: every lease this sidecar holds)",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        default="http://127.0.0.1:4040",
        help="the sidecar's localhost API, its --listen (default http://127.0.0.1:4040)",
    )
    return parser


def status_main(argv: Sequence[str]) -> int:
    parsed = vars(status_parser().parse_args(argv))
    config = _store_config("status", parsed)
    if config is None:
        return 2
    try:
        status = asyncio.run(gather_status(config))
    except ConfigError as exc:  # what only the store's client checks (a kubeconfig)
        print(f"leader-sidecar status: {terminal_text(exc)}", file=sys.stderr)
        return 2
    except NoStore as exc:
        print(f"leader-sidecar status: {terminal_text(exc)}", file=sys.stderr)
        return 1
    except (StoreError, TimeoutError, OSError) as exc:
        print(
            f"leader-sidecar status: the store did not answer: {terminal_text(exc)}",
            file=sys.stderr,
        )
        return 1
    if parsed["output"] == "json":
        print(json.dumps(status, indent=2))
    else:
        sys.stdout.write(render_table(status))
    return 0


_HOLD_EPILOG = """\
A hold is a grant like any other, to no replica: the leader stops at once (its later writes
carry an older term and are fenced), and nobody leads until `leader-sidecar resume`, or
until each replica has seen the hold for --for (so a forgotten hold ends by itself).
`leader-sidecar status` shows who set it, why and until when. Needs write access to the store.

exit status: 0 held, 1 the store did not answer or the hold could not be written, 2 bad usage.
"""
_RESUME_EPILOG = """\
Releases the hold: a replica whose app is up takes the lease at once.

exit status: 0 resumed (or not on hold), 1 the store did not answer, 2 bad usage.
"""


def hold_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar hold",
        description="Stop the job fleet-wide: every sidecar of the lease(s) answers 503 and "
        "nobody\ntakes the lease until `leader-sidecar resume` or --for passes.",
        epilog=_HOLD_EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--for",
        dest="hold_for",
        metavar="DURATION",
        default=None,
        help="how long the hold lasts at most, as each replica sees it (default 1h, at most 24h)",
    )
    parser.add_argument(
        "--reason", metavar="TEXT", default="", help="why, shown by status and in the logs"
    )
    add_options(parser, status_options())
    return parser


def resume_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar resume",
        description="End a hold set by `leader-sidecar hold`.",
        epilog=_RESUME_EPILOG,
        formatter_class=HelpFormatter,
    )
    add_options(parser, status_options())
    return parser


def _store_config(prog: str, parsed: dict[str, Any]) -> Config | None:
    """The store and leases from the status flags (and their variables); None after a
    one-line error on stderr. The command's own one line says why a store did not answer:
    the store clients' warnings ("… unavailable") would print before it through
    logging's last-resort handler."""
    logging.getLogger("sidecar").addHandler(logging.NullHandler())
    flags = [
        item
        for option in status_options()
        if parsed[option.dest] is not None
        for item in (option.flag, parsed[option.dest])
    ]
    try:
        return load(flags)
    except ConfigError as exc:
        print(f"leader-sidecar {prog}: {terminal_text(exc)}", file=sys.stderr)
        return None


def hold_main(argv: Sequence[str]) -> int:
    parsed = vars(hold_parser().parse_args(argv))
    duration = DEFAULT_HOLD
    if parsed["hold_for"] is not None:
        try:
            duration = parse_duration(parsed["hold_for"])
        except ValueError as exc:
            print(f"leader-sidecar hold: --for={parsed['hold_for']}: {exc}", file=sys.stderr)
            return 2
        if duration > MAX_LEASE_SECONDS:
            print(
                f"leader-sidecar hold: --for={parsed['hold_for']}: at most 24h; hold again to "
                "extend it",
                file=sys.stderr,
            )
            return 2
    config = _store_config("hold", parsed)
    if config is None:
        return 2
    who = default_who()
    try:
        held = asyncio.run(
            _each_lease(config, lambda store, t: hold(store, who, parsed["reason"], duration, t))
        )
    except ConfigError as exc:
        print(f"leader-sidecar hold: {terminal_text(exc)}", file=sys.stderr)
        return 2
    except (StoreError, TimeoutError, OSError, HoldRefused) as exc:
        print(f"leader-sidecar hold: {terminal_text(exc)}", file=sys.stderr)
        return 1
    for name, record in held:
        print(
            f"lease {terminal_text(name)} on hold (term {record.term}) by {terminal_text(who)} "
            f"for {duration:g}s; end it with: leader-sidecar resume"
        )
    return 0


def resume_main(argv: Sequence[str]) -> int:
    parsed = vars(resume_parser().parse_args(argv))
    config = _store_config("resume", parsed)
    if config is None:
        return 2
    try:
        resumed = asyncio.run(_each_lease(config, resume))
    except ConfigError as exc:
        print(f"leader-sidecar resume: {terminal_text(exc)}", file=sys.stderr)
        return 2
    except (StoreError, TimeoutError, OSError, HoldRefused) as exc:
        print(f"leader-sidecar resume: {terminal_text(exc)}", file=sys.stderr)
        return 1
    for name, record in resumed:
        what = "was not on hold" if record is None else "resumed: the replicas may lead again"
        print(f"lease {terminal_text(name)} {what}")
    return 0


async def _each_lease(config: Config, work: Any) -> list[tuple[str, Any]]:
    """``work(store, timeout)`` on every lease of ``config``, a bounded number at once."""
    from sidecar.backends import open_client

    client = open_client(config)
    try:
        limit = asyncio.Semaphore(READ_CONCURRENCY)
        timeout = max(5.0, config.timing.request_timeout)

        async def one(name: str) -> Any:
            async with limit:
                return await work(client.lease(name), timeout)

        names = list(config.lease_names)
        results = await asyncio.gather(*(one(name) for name in names))
    finally:
        await client.close()
    return [(config.ref(name), result) for name, result in zip(names, results, strict=True)]


def transfer_main(argv: Sequence[str]) -> int:
    parsed = transfer_parser().parse_args(argv)
    to, lease, url = parsed.to, parsed.lease, parsed.url
    unusable = _unusable_url(url)
    if unusable:
        print(f"leader-sidecar transfer: --url={_url_shown(url)}: {unusable}", file=sys.stderr)
        return 2
    body = {"to": to, **({"lease": lease} if lease else {})}
    request = urllib.request.Request(
        url.rstrip("/") + "/leader/transfer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", RELEASE_HEADER: "transfer"},
        method="POST",
    )
    shown_url = terminal_text(url)
    try:
        with _opener(url).open(request, timeout=10) as response:
            raw = response.read(MAX_ANSWER)
    except urllib.error.HTTPError as exc:
        detail = _error_of(exc.read(MAX_ANSWER))
        print(f"leader-sidecar transfer: refused ({exc.code}): {detail}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(
            f"leader-sidecar transfer: cannot reach the sidecar at {shown_url}: "
            f"{terminal_text(exc)}",
            file=sys.stderr,
        )
        return 1
    try:
        answer = bounded_json.loads(raw, 8)
    except ValueError:
        print(
            f"leader-sidecar transfer: the answer from {shown_url} is not JSON "
            f"(is --url the sidecar's localhost API?): {_shown(raw)}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(answer))  # (ASCII: every control character escaped)
    return 0


def _unusable_url(url: str) -> str | None:
    """What is wrong with ``--url``, said before any request: urllib's own words for
    ``127.0.0.1:4060`` are "unknown url type", which does not say that ``http://`` is missing."""
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unbalanced [ in the host
        parsed = None
    if parsed is not None and parsed.scheme in ("http", "https") and parsed.hostname:
        return None
    if "://" not in url:
        return (
            "http:// is missing; give the sidecar's --listen as a URL, "
            f"e.g. http://{_url_shown(url)}"
        )
    return "must be an http:// URL of the sidecar's --listen, e.g. http://127.0.0.1:4040"


def _url_shown(url: str) -> str:
    """``url`` for the one-line error: a password in it hidden (also without a scheme, where
    ``user:password@host`` would otherwise print as it is), escaped, cut short."""
    text = redact_url(url if "://" in url else "http://" + url)
    if "://" not in url:
        text = text.removeprefix("http://")
    return _shown(text.encode("utf-8", "surrogateescape"))


def _opener(url: str) -> urllib.request.OpenerDirector:
    """No proxy for a loopback address: the sidecar listens on the pod's own loopback, and
    ``http_proxy`` (set for the app's outbound traffic) would send the request elsewhere."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _error_of(raw: bytes) -> str:
    """A refusal's reason: the sidecar's ``{"error": ...}``, else the start of the answer;
    one line, escaped."""
    try:
        answer = bounded_json.loads(raw, 8)
    except ValueError:
        return _shown(raw)
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        return terminal_text(answer["error"])[:2000]
    return _shown(raw)


def _shown(raw: bytes) -> str:
    text = terminal_text(raw.decode("utf-8", "surrogateescape"))
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."
