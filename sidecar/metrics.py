"""The metrics of docs/design.md, on a registry the caller owns (tests get a fresh one each)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from fractions import Fraction

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.backends.base import Candidate, LeaseRecord
from sidecar.logs import Throttle, log

records_logger = logging.getLogger("sidecar.records")

PREFIX = "leader_sidecar_"

# Renewal-gap buckets as fractions of the lease, so that one edge is exactly half the lease
# whatever the lease is, and the alert threshold reads straight off a bucket. Kept as
# (numerator, denominator) and computed exactly from the lease as written, so a 3 s lease gets
# the edge 0.3, not 0.30000000000000004, in the `le` label. No edge above the lease:
# a renewal is only counted while the deadline (lease - safety margin) is ahead, so a larger
# gap is never observed; the edges are dense around the default renew interval (1/3) and the
# alert threshold (1/2) instead.
GAP_FRACTIONS: tuple[tuple[int, int], ...] = (
    (1, 10), (1, 5), (1, 4), (1, 3), (2, 5), (1, 2), (3, 5), (2, 3), (3, 4), (9, 10), (1, 1),
)  # fmt: skip

# Store round trips: from a loopback SQLite commit to a cross-zone Kubernetes API call.
STORE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

DEMOTION_REASONS = ("lost", "deadline", "released", "shutdown")
STORE_STEADY_OPS = ("acquire", "renew")  # what every replica sends all the time
STORE_ALERT_OUTCOMES = ("ok", "timeout", "unavailable", "error")  # what the alerts divide
ROLES = ("leader", "follower")
RECORD_KINDS = ("lease", "candidate")


def gap_buckets(lease_duration: float) -> list[float]:
    """Bucket edges of the renewal-gap histogram for this lease; one is exactly lease / 2."""
    lease = Fraction(repr(lease_duration))  # the decimal the user wrote, not the binary float
    return [float(lease * n / d) for n, d in GAP_FRACTIONS]


class _Families:
    """The metric families of one registry, shared by every lease's `Metrics`."""

    def __init__(self, registry: CollectorRegistry, lease_duration: float) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, ["lease"], registry=registry)

        self.is_leader = gauge("is_leader", "1 while this replica is the leader")
        self.term = gauge("term", "Term (fencing token) held or last observed")
        self.duration = gauge("lease_duration_seconds", "Configured lease duration")
        self.renewal_gap = Histogram(
            PREFIX + "renewal_gap_seconds",
            "Time between the sends of consecutive successful renewals (or acquire → renewal)",
            ["lease"],
            buckets=gap_buckets(lease_duration),
            registry=registry,
        )
        self.seconds_since_renewal = gauge(
            "seconds_since_renewal",
            "While leading: seconds since the last successful renewal was sent; 0 otherwise",
        )
        self.gap_over_half_lease = Counter(
            PREFIX + "renewal_gap_over_half_lease",
            "Renewal gaps (finished or still growing) longer than half the lease",
            ["lease"],
            registry=registry,
        )
        self.transitions = Counter(
            PREFIX + "transitions",
            "Role changes of this replica",
            ["lease", "role"],
            registry=registry,
        )
        self.demotions = Counter(
            PREFIX + "demotions",
            "Times this replica stopped leading, by reason",
            ["lease", "reason"],
            registry=registry,
        )
        self.store_requests = Counter(
            PREFIX + "store_requests",
            "Requests to the lease store by operation and outcome",
            ["lease", "op", "outcome"],
            registry=registry,
        )
        self.store_duration = Histogram(
            PREFIX + "store_request_duration_seconds",
            "Latency of lease store requests",
            ["lease", "op"],
            buckets=STORE_BUCKETS,
            registry=registry,
        )
        self.bad_records = Counter(
            PREFIX + "bad_records",
            "Records read from the store that could not be read (or had a field that could "
            "not), by kind; each stored version counted once",
            ["kind"],
            registry=registry,
        )
        for kind in RECORD_KINDS:
            self.bad_records.labels(kind)
        self.bad_records_log = Throttle()  # one line per 10 s for the whole sidecar
        # What client-go's leader election exports, so existing dashboards and alerts work.
        self.master_status = Gauge(
            "leader_election_master_status",
            "1 if this replica is the leader of the lease 'name' (client-go compatible)",
            ["name"],
            registry=registry,
        )


# One set of families per registry: every lease of a sidecar adds its children to the same
# families (a family registered twice is an error in prometheus_client).
_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


class Metrics:
    """Every metric the sidecar exports for one lease; each carries the ``lease`` label
    (bounded: by the leases configured, see `sidecar.config.MAX_LEASES`)."""

    def __init__(self, registry: CollectorRegistry, lease: str, lease_duration: float) -> None:
        self.registry = registry
        self.lease = lease
        families = _FAMILIES.get(registry)
        if families is None:
            families = _FAMILIES[registry] = _Families(registry, lease_duration)
        self._families = families
        label = {"lease": lease}
        self.is_leader = families.is_leader.labels(**label)
        self.term = families.term.labels(**label)
        families.duration.labels(**label).set(lease_duration)
        self.renewal_gap = families.renewal_gap.labels(**label)
        self.seconds_since_renewal = families.seconds_since_renewal.labels(**label)
        self.gap_over_half_lease = families.gap_over_half_lease.labels(**label)
        self._transitions = families.transitions
        self._demotions = families.demotions
        self._store_requests = families.store_requests
        self._store_duration = families.store_duration
        self.master_status = families.master_status.labels(name=lease)
        for role in ROLES:  # export zeros so rate() works from the first scrape
            self._transitions.labels(lease, role)
        for reason in DEMOTION_REASONS:
            self._demotions.labels(lease, reason)
        # The store's failure outcomes too: a series first scraped at 3 shows no increase(), so
        # without a zero the first failures after a healthy spell would be invisible to alerts.
        for op in STORE_STEADY_OPS:
            for outcome in STORE_ALERT_OUTCOMES:
                self._store_requests.labels(lease, op, outcome)

    def bind(self, leading: Callable[[], bool], since_renewal: Callable[[], float]) -> None:
        """Evaluate leadership and renewal age at scrape time, never from a cached flag."""
        self.is_leader.set_function(lambda: 1.0 if leading() else 0.0)
        self.master_status.set_function(lambda: 1.0 if leading() else 0.0)
        self.seconds_since_renewal.set_function(since_renewal)

    def transition(self, role: str) -> None:
        self._transitions.labels(self.lease, role).inc()

    def demotion(self, reason: str) -> None:
        self._demotions.labels(self.lease, reason).inc()

    def bad_record(self, kind: str, record: LeaseRecord | Candidate, **where: object) -> None:
        """Count a record that could not be read, or had a field that could not, and log it
        (at most one line per 10 s per sidecar, with how many were not logged)."""
        self._families.bad_records.labels(kind).inc()
        throttle = self._families.bad_records_log
        if not throttle.allow():
            return
        if record.unreadable is None:
            message = f"a {kind} record in the store has a field that cannot be read; ignored"
        elif kind == "lease":
            message = (
                "a lease record in the store cannot be read: its holder is unknown, so it is "
                "waited out for a lease like a lost one, then taken over conditionally"
            )
        else:
            message = "a candidate record in the store cannot be read; it is left out"
        log(
            records_logger,
            "warning",
            message,
            **where,
            problem=record.unreadable or record.ignored,
            suppressed=throttle.take_suppressed(),
        )

    def store_request(self, op: str, outcome: str, seconds: float) -> None:
        self._store_requests.labels(self.lease, op, outcome).inc()
        self._store_duration.labels(self.lease, op).observe(seconds)
