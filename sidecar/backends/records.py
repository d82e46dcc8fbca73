"""Every record read from a store is checked here, at the boundary, before anything else sees
it: lease records (`lease_record`) and candidate records (`candidate`).

Why: a store is shared, and what it holds was not necessarily written by this version of the
sidecar — an older or newer one, a hand edit, a restored backup, or anyone who can write to
it. Issue 25 found one candidate row with ``priority='abc'`` killing the candidate heartbeat of
every sidecar, a term of 2^63 - 1 overflowing every grant after it (and remembered as the
highest term seen after the row was mended), and an unparsable timestamp killing the SQLite
poller. Each store decodes what it holds into plain Python values, *whatever types they turn
out to be*, and hands them to the functions below; nothing of a record reaches the elector,
the candidates or the API without passing them.

**How to call them** (every store, the new ones too). Decode the store's own encoding into
Python values without checking anything (a JSON document that does not parse, a column of
the wrong type, bytes that are not UTF-8: hand over what you got; decode text with
``errors="surrogateescape"`` so that bad bytes arrive here as lone surrogates), then call
``lease_record(holder=…, term=…, …, max_term=…)`` or ``candidate(identity=…, …)``. They never
raise on bad data: they return a record, good or *unreadable*.

**The rules** (types, ranges, lengths, Unicode):

* text — holder, successor, handed, a candidate's identity, version and revision: ``str``,
  valid Unicode (no lone surrogate: the UTF-8 was valid), no control characters, at most
  `MAX_TEXT` characters; a holder or identity is not empty.
* term — an ``int`` (not a ``bool``), 0 to ``max_term``: what the store can hold and write
  back exactly (`MAX_TERM`; a Kubernetes Lease's ``leaseTransitions`` is an int32). A store
  refuses to *write* a term past its bound (`check_term`).
* duration — a number, finite, at most `MAX_LEASE_SECONDS`, and above 0 where there is a
  holder (a released record or a loss marker may say 0: nobody times it).
* timestamps — None, an aware ``datetime``, or ISO-8601 text (``Z`` and up to nine fractional
  digits accepted; no zone means UTC). They are for humans and never grant, so one that cannot
  be parsed reads as None and the record stays readable, with ``ignored`` saying so: making it
  a record of unknown holder would cost a fail-over for a display field.
* a candidate's priority — an ``int`` of at most nine digits, as ``--priority`` allows; its
  leaving mark — a ``bool`` (or the integers 0 and 1).

**What a bad record becomes.** A lease record that cannot be read is a record of *unknown
holder*: ``holder`` None, not released, ``term`` 0, ``duration`` 0, its ``version`` as the
store reports it (the store must report one that names exactly what it holds, so that the
record can be taken over conditionally), and ``unreadable`` saying why. It is never free: the
elector treats it as a loss (rules 2, 5 and 8, `sidecar.observed`) — waited out for a full lease
from when it was first seen, then taken only through a conditional write on that version,
with a term above every term seen (``LOSS_TERM_GAP`` higher). Its term is never remembered as
the highest seen. A candidate record that cannot be read is left out: marked ``leaving`` (never
handed a lease, never counted) with ``unreadable`` saying why; `sidecar.candidates` drops it.
Either is logged (at most one line per 10 s) and counted
(``leader_sidecar_unreadable_records_total{kind}``) by the reader, once per record version.
"""

from __future__ import annotations

import functools
import logging
import math
from datetime import UTC, datetime
from typing import Any

from sidecar.backends.base import Candidate, LeaseRecord, TermExhausted
from sidecar.logs import Throttle, log
from sidecar.redact import printable
from sidecar.timing import MAX_LEASE_SECONDS

logger = logging.getLogger("sidecar.records")

MAX_TERM = 10**14 - 1
"""The highest term any store but Kubernetes holds: Redis's Lua writes numbers with 14
significant digits (cjson), and a JSON reader holds it exactly as a double. A grant gets at
most this; a record showing more cannot be read."""

MAX_TEXT = 256
"""Characters in an identity, a version, a revision: pod names are at most 253."""

MAX_PRIORITY = 999_999_999  # `--priority`: at most nine digits, either sign

_FRACTION_DIGITS = "0123456789"


class _Bad(ValueError):
    """One field that cannot be read: ``str()`` names the field and what is wrong."""


def lease_record(
    *,
    holder: object,
    term: object,
    duration: object,
    version: str,
    released: object = False,
    successor: object = None,
    handed: object = None,
    acquired_at: object = None,
    renewed_at: object = None,
    max_term: int = MAX_TERM,
) -> LeaseRecord:
    """The record a store holds, checked field by field (see the module docstring); an
    unreadable one if any field is bad. ``holder`` None means no holder: released (when
    ``released``) or lost (a loss marker). ``version`` is the store's own, made so that it
    names exactly what is stored — it is what a takeover is conditional on."""
    ignored: list[str] = []
    try:
        return LeaseRecord(
            holder=_text("holder", holder, optional=True),
            term=_term("term", term, max_term),
            duration=_duration(duration, held=holder is not None),
            version=_text("version", version),
            released=_flag("released", released),
            successor=_text("successor", successor, optional=True),
            handed=_text("handed", handed, optional=True),
            acquired_at=_stamp("acquired_at", acquired_at, ignored),
            renewed_at=_stamp("renewed_at", renewed_at, ignored),
            ignored="; ".join(ignored) or None,
        )
    except _Bad as bad:
        return unreadable_lease(version, str(bad))


def unreadable_lease(version: str, problem: str) -> LeaseRecord:
    """A record of unknown holder (see the module docstring), conditional on ``version``."""
    return LeaseRecord(
        holder=None,
        term=0,
        duration=0.0,
        version=version,
        released=False,
        unreadable=problem,
    )


def candidate(
    *,
    identity: object,
    version: object,
    revision: object = "",
    priority: object = 0,
    leaving: object = False,
    started_at: object = None,
    beat_at: object = None,
    app: object = "",
) -> Candidate:
    """A candidate record, checked field by field; if any is bad, one marked ``unreadable``
    and ``leaving`` (never handed a lease, never counted), its identity shown escaped."""
    ignored: list[str] = []
    try:
        return Candidate(
            identity=_text("identity", identity),
            version=_text("version", version),
            revision=_text("revision", revision, optional=True) or "",
            priority=_priority(priority),
            leaving=_flag("leaving", leaving),
            started_at=_stamp("started_at", started_at, ignored),
            beat_at=_stamp("beat_at", beat_at, ignored),
            app=_app(app, ignored),
            ignored="; ".join(ignored) or None,
        )
    except _Bad as bad:
        return unreadable_candidate(identity, version, str(bad))


APP_STATES = ("", "up", "down")


def _app(value: object, ignored: list[str]) -> str:
    """A candidate's app state is for humans (``status``); what a hand-over chooses by is the
    ``leaving`` mark. One that cannot be read reads as unknown, the record stays readable."""
    if value is None or value in APP_STATES:
        return str(value or "")
    ignored.append(f"app: {shown(value)} is not up or down")
    return ""


def unreadable_candidate(identity: object, version: object, problem: str) -> Candidate:
    """A candidate record that is left out: marked ``leaving`` and ``unreadable``, shown
    escaped (its version is what changes when it is written again)."""
    return Candidate(
        identity=shown(identity),
        version=shown(version),
        leaving=True,
        unreadable=problem,
    )


def check_term(term: int, max_term: int, where: str) -> int:
    """``term``, if a store bounded by ``max_term`` can hold it; else log (at most once per
    10 s) and raise `TermExhausted`. Every store calls it before it writes a new term."""
    if 0 <= term <= max_term:
        return term
    message = (
        f"{where}: refusing to grant term {term}: the store holds terms up to {max_term}. "
        "Terms only grow, so this lease cannot be granted again as it is; see "
        "docs/operations.md#a-term-past-what-the-store-holds"
    )
    if _TERM_LOG.allow():
        log(logger, "error", "term past what the store holds", error=message,
            suppressed=_TERM_LOG.take_suppressed())  # fmt: skip
    raise TermExhausted(message)


_TERM_LOG = Throttle()  # one line per 10 s for the whole process: the case is rare and loud


def shown(value: object) -> str:
    """``value`` as text safe to show (control characters and bad bytes escaped), short."""
    if isinstance(value, str):
        text = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    elif isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    else:
        text = repr(value)
    text = printable(text)
    return text if len(text) <= 80 else text[:77] + "..."


def _stamp(field: str, value: object, ignored: list[str]) -> datetime | None:
    try:
        return wall_time(field, value)
    except ValueError as bad:
        ignored.append(str(bad))
        return None


def wall_time(field: str, value: object) -> datetime | None:
    """A stamp for humans (and garbage collection): None, an aware datetime, or ISO-8601
    text (``Z``, up to nine fractional digits; no zone means UTC). Raises ValueError, naming
    ``field``, for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and len(value) <= 64:
        moment = _parse_iso(field, value)
    else:
        raise _Bad(f"{field}: not a timestamp ({shown(value)})")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@functools.lru_cache(maxsize=64)
def _parse_iso(field: str, text: str) -> datetime:
    """Cached: a batch renews a thousand leases under one stamp, and every replica reads each
    of them. Only the last few stamps: each lease's own ``acquired_at`` would fill a large
    cache (4,096 entries held ~1.1 MB, and filled in about an hour at 1,000 leases), and
    parsing one again costs ~0.6 µs. Datetimes are immutable; a text that is not a timestamp
    raises, which is not cached."""
    head, dot, rest = text.partition(".")
    if dot:  # fromisoformat takes at most six fractional digits before Python 3.12
        digits = len(rest) - len(rest.lstrip(_FRACTION_DIGITS))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _Bad(f"{field}: not an ISO-8601 timestamp ({shown(text)})") from None


def _text(field: str, value: object, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{field}: not text ({shown(value)})")
    if not value and not optional:
        raise _Bad(f"{field}: empty")
    if len(value) > MAX_TEXT:
        raise _Bad(f"{field}: longer than {MAX_TEXT} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad(f"{field}: not valid UTF-8 ({shown(value)})") from None
    if printable(value) != value:
        raise _Bad(f"{field}: contains control characters ({shown(value)})")
    return value


def _term(field: str, value: object, max_term: int) -> int:
    if type(value) is not int:
        raise _Bad(f"{field}: not a whole number ({shown(value)})")
    if not 0 <= value <= max_term:
        raise _Bad(f"{field}: {value} is outside 0..{max_term}, what the store can hold")
    return value


def _duration(value: object, *, held: bool) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise _Bad(f"duration: not a number of seconds ({shown(value)})")
    seconds = float(value)  # type: ignore[arg-type]
    if not (seconds > 0 if held else seconds >= 0) or seconds > MAX_LEASE_SECONDS:
        raise _Bad(f"duration: {seconds:g}s is outside (0, {MAX_LEASE_SECONDS:g}s]")
    return seconds


def _flag(field: str, value: object) -> bool:
    if value in (True, False) and type(value) in (bool, int):
        return bool(value)
    raise _Bad(f"{field}: not true or false ({shown(value)})")


def _priority(value: object) -> int:
    if type(value) is not int or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise _Bad(f"priority: not a whole number of at most nine digits ({shown(value)})")
    return value
