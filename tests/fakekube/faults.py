"""Fault injection, set through the control endpoint (``PUT /_fake/faults``).

``{"latency": 0.5, "latency_match": {...},
   "errors": [{"status": 500, "count": 3, "match": {"verbs": ["update"], "resources": ["leases"]}}],
   "forbid": [{"verbs": ["patch"], "resources": ["pods"]}]}``

* ``latency``: seconds added before answering every matching API request (a stalled server).
* ``errors``: answer matching requests with this status instead of serving them: 500
  (InternalError), 503 (ServiceUnavailable), 504, 409 (the exact Conflict body, as a lost
  compare-and-swap race would), or 429 as API Priority and Fairness answers it
  (``recorded/apf.json``: a *plain-text* body and ``Retry-After``, after authentication and
  before authorization); ``retry_after`` sets the ``Retry-After`` seconds (429: 1 unless given;
  5xx: none unless given); ``count`` limits how many (absent: forever), ``every`` answers only
  every n-th matching request.
* ``end_watches``: every watch request (``end_watches_match`` narrows it) is answered ``200``
  with an empty body at once, as a proxy or load balancer that closes long streams does.
* ``expire_watches``: every watch request that resumes from a resourceVersion
  (``expire_watches_match`` narrows it) is answered ``200`` with the ``410 Expired`` ``ERROR``
  event at once, as the real server answers a resourceVersion older than its history: a
  client that keeps resuming from versions the server has compacted.
* ``redirect``: ``{"location": URL, "status": 307, "match": {...}}`` answers matching requests
  with that redirect (302, 307 or 308) before anything else, as a misrouted load balancer
  would; the location gets the request's path and query appended.
* ``forbid``: answer 403 Forbidden with the RBAC message, as a missing Role rule would.
* ``freeze``: hold every matching request (``freeze_match``) until the faults are changed,
  then serve the held ones in arrival order: an API server whose storage stalled and came
  back. A client that gave up meanwhile still has its write applied on resume.
* ``late``: ``[{"delay": 1.5, "count": 1, "match": {"verbs": ["update"]}}]`` serves a
  matching request only ``delay`` seconds after it arrived, whether or not the client is
  still waiting: a write the client gave up on (its timeout) is applied after it gave up.
  ``count`` limits how many requests are held (absent: all).

A match has optional ``verbs`` (get, list, watch, create, update, patch, delete),
``resources`` (leases, pods, events, …) and ``names``; absent means any.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Match:
    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    names: frozenset[str] | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> Match:
        raw = raw or {}

        def field(name: str) -> frozenset[str] | None:
            value = raw.get(name)
            return frozenset(value) if value is not None else None

        return cls(field("verbs"), field("resources"), field("names"))

    def matches(self, verb: str, resource: str, name: str) -> bool:
        return (
            (self.verbs is None or verb in self.verbs)
            and (self.resources is None or resource in self.resources)
            and (self.names is None or name in self.names)
        )


@dataclasses.dataclass
class ErrorRule:
    status: int
    match: Match
    count: int | None = None  # remaining; None = forever
    every: int = 1
    seen: int = 0
    retry_after: int | None = None  # the Retry-After header's seconds, if any

    def take(self, verb: str, resource: str, name: str) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if not self.match.matches(verb, resource, name):
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        if self.count is not None:
            self.count -= 1
        return True


@dataclasses.dataclass
class LateRule:
    delay: float
    match: Match
    count: int | None = None  # remaining; None = forever
    held: int = 0

    def take(self, verb: str, resource: str, name: str) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if not self.match.matches(verb, resource, name):
            return False
        if self.count is not None:
            self.count -= 1
        self.held += 1
        return True


@dataclasses.dataclass
class Redirect:
    location: str
    status: int
    match: Match


@dataclasses.dataclass
class Faults:
    latency: float = 0.0
    latency_match: Match = dataclasses.field(default_factory=Match)
    errors: list[ErrorRule] = dataclasses.field(default_factory=list)
    forbid: list[Match] = dataclasses.field(default_factory=list)
    freeze: bool = False
    freeze_match: Match = dataclasses.field(default_factory=Match)
    late: list[LateRule] = dataclasses.field(default_factory=list)
    end_watches: bool = False
    end_watches_match: Match = dataclasses.field(default_factory=Match)
    expire_watches: bool = False
    expire_watches_match: Match = dataclasses.field(default_factory=Match)
    redirect: Redirect | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Faults:
        allowed = {
            "latency", "latency_match", "errors", "forbid", "freeze", "freeze_match", "late",
            "end_watches", "end_watches_match", "expire_watches", "expire_watches_match",
            "redirect",
        }  # fmt: skip
        unknown = set(raw) - allowed
        if unknown:
            raise ValueError(f"unknown fault settings {sorted(unknown)}; allowed {sorted(allowed)}")
        errors = []
        for rule in raw.get("errors", []):
            if rule.get("status") not in (409, 429, 500, 503, 504):
                raise ValueError("errors[].status must be one of 409, 429, 500, 503, 504")
            retry_after = rule.get("retry_after", 1 if rule["status"] == 429 else None)
            errors.append(
                ErrorRule(
                    status=int(rule["status"]),
                    match=Match.parse(rule.get("match")),
                    count=rule.get("count"),
                    every=int(rule.get("every", 1)),
                    retry_after=None if retry_after is None else int(retry_after),
                )
            )
        redirect = None
        if raw.get("redirect") is not None:
            spec = raw["redirect"]
            if spec.get("status", 307) not in (302, 307, 308) or not spec.get("location"):
                raise ValueError("redirect needs a location and a status of 302, 307 or 308")
            redirect = Redirect(
                str(spec["location"]), int(spec.get("status", 307)), Match.parse(spec.get("match"))
            )
        return cls(
            latency=float(raw.get("latency", 0.0)),
            latency_match=Match.parse(raw.get("latency_match")),
            errors=errors,
            forbid=[Match.parse(item) for item in raw.get("forbid", [])],
            freeze=bool(raw.get("freeze", False)),
            freeze_match=Match.parse(raw.get("freeze_match")),
            late=[
                LateRule(
                    delay=float(rule["delay"]),
                    match=Match.parse(rule.get("match")),
                    count=rule.get("count"),
                )
                for rule in raw.get("late", [])
            ],
            end_watches=bool(raw.get("end_watches", False)),
            end_watches_match=Match.parse(raw.get("end_watches_match")),
            expire_watches=bool(raw.get("expire_watches", False)),
            expire_watches_match=Match.parse(raw.get("expire_watches_match")),
            redirect=redirect,
        )

    def delay_for(self, verb: str, resource: str, name: str) -> float:
        if self.latency > 0 and self.latency_match.matches(verb, resource, name):
            return self.latency
        return 0.0

    def frozen(self, verb: str, resource: str, name: str) -> bool:
        return self.freeze and self.freeze_match.matches(verb, resource, name)

    def late_for(self, verb: str, resource: str, name: str) -> float:
        """Seconds to hold this request before serving it (0: serve now)."""
        for rule in self.late:
            if rule.take(verb, resource, name):
                return rule.delay
        return 0.0

    def error_for(self, verb: str, resource: str, name: str, *, throttle: bool) -> ErrorRule | None:
        """The rule answering this request: a 429 (``throttle``: where API Priority and
        Fairness rejects, before authorization) or any other status (after it)."""
        for rule in self.errors:
            if (rule.status == 429) == throttle and rule.take(verb, resource, name):
                return rule
        return None

    def ends_watch(self, verb: str, resource: str, name: str) -> bool:
        return (
            self.end_watches
            and verb == "watch"
            and self.end_watches_match.matches(verb, resource, name)
        )

    def expires_watch(self, verb: str, resource: str, name: str) -> bool:
        return (
            self.expire_watches
            and verb == "watch"
            and self.expire_watches_match.matches(verb, resource, name)
        )

    def redirect_for(self, verb: str, resource: str, name: str) -> Redirect | None:
        if self.redirect is not None and self.redirect.match.matches(verb, resource, name):
            return self.redirect
        return None

    def forbidden(self, verb: str, resource: str, name: str) -> bool:
        return any(match.matches(verb, resource, name) for match in self.forbid)

    def describe(self) -> dict[str, Any]:
        return {
            "latency": self.latency,
            "errors": [
                {
                    "status": rule.status,
                    "remaining": rule.count,
                    "seen": rule.seen,
                    "retry_after": rule.retry_after,
                }
                for rule in self.errors
            ],
            "end_watches": self.end_watches,
            "expire_watches": self.expire_watches,
            "redirect": self.redirect.location if self.redirect else None,
            "forbid": len(self.forbid),
            "freeze": self.freeze,
            "late": [
                {"delay": rule.delay, "remaining": rule.count, "held": rule.held}
                for rule in self.late
            ],
        }
