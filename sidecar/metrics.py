"""The metrics of docs/design.md, on a registry the caller owns (tests get a fresh one each)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.logs import Throttle, log

if TYPE_CHECKING:
    from sidecar.backends.base import Candidate, LeaseRecord
    from sidecar.config import Config

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

DEMOTION_REASONS = ("lost", "deadline", "released", "shutdown", "app_down", "drain", "hold")
HANDOVER_REASONS = ("app_down", "drain", "hold")  # moves made because of the app or an operator
DRAIN_OUTCOMES = ("app_stopped", "released", "timeout")
STORE_STEADY_OPS = ("acquire", "renew")  # what every replica sends all the time
STORE_ALERT_OUTCOMES = ("ok", "timeout", "unavailable", "error")  # what the alerts divide
ROLES = ("leader", "follower")
RECORD_KINDS = ("lease", "candidate")


def gap_buckets(lease_duration: float) -> list[float]:
    """Bucket edges of the renewal-gap histogram for this lease; one is exactly lease / 2."""
    # The decimal the user wrote, not the binary float.
    numerator, denominator = decimal_ratio(repr(lease_duration))
    return [numerator * n / (denominator * d) for n, d in GAP_FRACTIONS]


def decimal_ratio(text: str) -> tuple[int, int]:
    """A finite float's ``repr`` (``4.5``, ``1e-05``, ``1.5e+20``) as the exact ratio of two
    integers. Their ``/`` rounds correctly, as `fractions.Fraction` does: the same edges,
    without importing `fractions` (and `decimal`, ~2 ms) before the first answer."""
    mantissa, _, exponent = text.partition("e")
    whole, _, digits = mantissa.partition(".")
    numerator, denominator = int(whole + digits), 10 ** len(digits)
    shift = int(exponent or "0")
    if shift >= 0:
        return numerator * 10**shift, denominator
    return numerator, denominator * 10**-shift


class ScrapedState(Protocol):
    """What a lease's metrics read at scrape time (the `Elector`)."""

    def is_leader(self) -> bool: ...

    def seconds_since_renewal(self) -> float: ...

    def hold_shown(self) -> tuple[float, float] | None: ...


class _NotBound:
    """Before `Metrics.bind`: not leading, no renewal."""

    def is_leader(self) -> bool:
        return False

    def seconds_since_renewal(self) -> float:
        return 0.0

    def hold_shown(self) -> tuple[float, float] | None:
        return None


_NOT_BOUND = _NotBound()


class _Lease:
    """One lease's values of the families kept per lease (`_PerLease`): a few slots instead of
    a prometheus_client child per family (each ~0.9 KB with its lock and label dict: 3.5 MB at
    1,000 leases). The API of the children it replaces: ``set``, ``inc``."""

    __slots__ = ("_labels", "_source", "created", "gaps", "value")

    def __init__(self, labels: tuple[str, str]) -> None:
        self._labels = labels
        # Read at scrape time: the elector itself, not two bound methods of it (memory per lease).
        self._source: ScrapedState = _NOT_BOUND
        self.value = 0.0  # the term
        self.gaps = 0.0  # renewal gaps past half the lease
        self.created = time.time()


class _Value:
    """``set`` / ``inc`` of one `_Lease` field, as the child of a family would take them."""

    __slots__ = ("_field", "_lease")

    def __init__(self, lease: _Lease, field: str) -> None:
        self._lease = lease
        self._field = field

    def set(self, value: float) -> None:
        setattr(self._lease, self._field, float(value))

    def inc(self, amount: float = 1.0) -> None:
        setattr(self._lease, self._field, getattr(self._lease, self._field) + amount)


class _PerLease:
    """A collector of one per-lease family, its value read from every lease's `_Lease` at
    scrape time (``is_leader`` and ``seconds_since_renewal`` evaluated then, never cached)."""

    def __init__(self, name: str, doc: str, kind: str, leases: list[_Lease]) -> None:
        self._name = name
        self._doc = doc
        self._kind = kind  # is_leader | term | seconds_since_renewal | gaps
        self._leases = leases

    def _family(self) -> GaugeMetricFamily | CounterMetricFamily:
        labels = ["lease", "lease_group"]
        if self._kind == "gaps":
            return CounterMetricFamily(self._name, self._doc, labels=labels)
        return GaugeMetricFamily(self._name, self._doc, labels=labels)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        kind = self._kind
        # prometheus_client's own switch (PROMETHEUS_DISABLE_CREATED_SERIES): private, so a
        # release that renames it must not fail every scrape — emit _created, its default.
        created = getattr(prometheus_client.metrics, "_use_created", True)
        for lease in list(self._leases):
            labels = list(lease._labels)
            if kind == "is_leader":
                family.add_metric(labels, 1.0 if lease._source.is_leader() else 0.0)
            elif kind == "term":
                family.add_metric(labels, lease.value)
            elif kind == "seconds_since_renewal":
                family.add_metric(labels, lease._source.seconds_since_renewal())
            elif kind in ("hold_seconds", "hold_duration"):
                # Only a lease on hold has these series: 1,000 shards pay nothing for them.
                hold = lease._source.hold_shown()
                if hold is not None:
                    family.add_metric(labels, hold[0] if kind == "hold_seconds" else hold[1])
            else:
                assert isinstance(family, CounterMetricFamily)
                family.add_metric(labels, lease.gaps, created=lease.created if created else None)
        yield family


class _Families:
    """The metric families of one registry, shared by every lease's `Metrics`.

    Two kinds, so that 1,000 shards stay affordable to scrape: what an alert or a person needs
    for each lease (leader, term, renewal age, gaps past half the lease) is labelled by
    ``lease``; the rest (histograms, store traffic, transitions, demotions) is labelled by
    ``lease_group`` — the ``--lease`` name shards were made from — and by ``lease`` too only
    when ``per_lease`` (``--metrics-per-lease``). Every series carries ``lease_group``, so one
    rule reads both shapes."""

    def __init__(
        self, registry: CollectorRegistry, lease_duration: float, *, per_lease: bool
    ) -> None:
        self.per_lease = per_lease
        each = ["lease", "lease_group"]  # the per-lease families
        grouped = each if per_lease else ["lease_group"]

        def gauge(name: str, doc: str, labels: list[str] = each) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=registry)

        # The families kept per lease: one collector each over every lease's `_Lease`.
        self.leases: list[_Lease] = []

        def each_lease(name: str, doc: str, kind: str) -> None:
            registry.register(_PerLease(PREFIX + name, doc, kind, self.leases))

        each_lease("is_leader", "1 while this replica is the leader", "is_leader")
        each_lease("term", "Term (fencing token) held or last observed", "term")
        self.duration = gauge("lease_duration_seconds", "Configured lease duration", grouped)
        self.renewal_gap = Histogram(
            PREFIX + "renewal_gap_seconds",
            "Time between the sends of consecutive successful renewals (or acquire → renewal)",
            grouped,
            buckets=gap_buckets(lease_duration),
            registry=registry,
        )
        since_renewal = (
            "While leading: seconds since the last successful renewal was sent; 0 otherwise"
        )
        each_lease("since_renewal_seconds", since_renewal, "seconds_since_renewal")
        # The earlier name (the unit first, against Prometheus's naming), kept for one
        # release so that alerts and dashboards written for it keep working while they move;
        # with the per-lease detail only, as client-go's name: at 1,000 shards it would add
        # 1,000 series to a budget of 5,000 (docs/operations.md#renamed-metrics).
        if per_lease:
            each_lease(
                "seconds_since_renewal",
                f"Deprecated, removed in the next release: {PREFIX}since_renewal_seconds. "
                + since_renewal,
                "seconds_since_renewal",
            )
        each_lease(
            "hold_seconds",
            "Only for a lease on an operator's hold (leader-sidecar hold): seconds since this "
            "replica first saw the hold",
            "hold_seconds",
        )
        each_lease(
            "hold_duration_seconds",
            "Only for a lease on an operator's hold: how long the hold was set for (--for); "
            "it ends by itself this long after each replica first saw it",
            "hold_duration",
        )
        each_lease(
            "renewal_gap_over_half_lease",
            "Renewal gaps (finished or still growing) longer than half the lease",
            "gaps",
        )
        self.transitions = Counter(
            PREFIX + "transitions",
            "Role changes of this replica",
            [*grouped, "role"],
            registry=registry,
        )
        self.demotions = Counter(
            PREFIX + "demotions",
            "Times this replica stopped leading, by reason",
            [*grouped, "reason"],
            registry=registry,
        )
        self.store_requests = Counter(
            PREFIX + "store_requests",
            "Requests to the lease store by operation and outcome",
            [*grouped, "op", "outcome"],
            registry=registry,
        )
        self.store_duration = Histogram(
            PREFIX + "store_request_duration_seconds",
            "Latency of lease store requests",
            [*grouped, "op"],
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
        # What client-go's leader election exports, so existing dashboards and alerts work:
        # part of the per-lease detail. client-go has no shards, so no client-go dashboard
        # watches one; a sharded sidecar's leadership is `is_leader` (docs/operations.md).
        self.master_status = (
            Gauge(
                "leader_election_master_status",
                "1 if this replica is the leader of the lease 'name' (client-go compatible)",
                ["name"],
                registry=registry,
            )
            if per_lease
            else None
        )


# One set of families per registry: every lease of a sidecar adds its children to the same
# families (a family registered twice is an error in prometheus_client).
_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()


class Metrics:
    """Every metric the sidecar exports for one lease (bounded: by the leases configured, see
    `sidecar.config.MAX_LEASES`). ``group`` is the lease's ``lease_group`` (default: the lease
    itself); ``per_lease`` labels every family by lease too, and is one choice per registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        lease: str,
        lease_duration: float,
        *,
        group: str | None = None,
        per_lease: bool = True,
    ) -> None:
        self.registry = registry
        self.lease = lease
        self.group = lease if group is None else group
        families = _FAMILIES.get(registry)
        if families is None:
            families = _FAMILIES[registry] = _Families(
                registry, lease_duration, per_lease=per_lease
            )
        elif families.per_lease != per_lease:
            raise ValueError("per_lease is one choice for every lease of a registry")
        self._families = families
        each = (lease, self.group)
        # The labels of the families kept per group: shared by the leases of one group.
        self._grouped = each if per_lease else (self.group,)
        self._lease = _Lease(each)
        families.leases.append(self._lease)
        self.term = _Value(self._lease, "value")
        families.duration.labels(*self._grouped).set(lease_duration)
        self.renewal_gap = families.renewal_gap.labels(*self._grouped)
        self.gap_over_half_lease = _Value(self._lease, "gaps")
        self._transitions = families.transitions
        self._demotions = families.demotions
        self._store_requests = families.store_requests
        self._store_duration = families.store_duration
        self.master_status = (
            None if families.master_status is None else families.master_status.labels(lease)
        )
        for role in ROLES:  # export zeros so rate() works from the first scrape
            self._transitions.labels(*self._grouped, role)
        for reason in DEMOTION_REASONS:
            self._demotions.labels(*self._grouped, reason)
        # The store's failure outcomes too: a series first scraped at 3 shows no increase(), so
        # without a zero the first failures after a healthy spell would be invisible to alerts.
        for op in STORE_STEADY_OPS:
            for outcome in STORE_ALERT_OUTCOMES:
                self._store_requests.labels(*self._grouped, op, outcome)

    def bind(self, source: ScrapedState) -> None:
        """Evaluate leadership and renewal age at scrape time, never from a cached flag."""
        self._lease._source = source
        if self.master_status is not None:
            self.master_status.set_function(lambda: 1.0 if source.is_leader() else 0.0)

    def transition(self, role: str) -> None:
        self._transitions.labels(*self._grouped, role).inc()

    def demotion(self, reason: str) -> None:
        self._demotions.labels(*self._grouped, reason).inc()

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
        self._store_requests.labels(*self._grouped, op, outcome).inc()
        self._store_duration.labels(*self._grouped, op).observe(seconds)


class AppMetrics:
    """Leadership follows the app (`sidecar.app_check`): exported only when an app check is
    configured, once per sidecar, labelled with its candidates' group (``lease_group``: the
    first --lease, as users name it), so the alerts name what is not being done."""

    def __init__(
        self,
        registry: CollectorRegistry,
        app_up: Callable[[], bool],
        alone_seconds: Callable[[], float],
        outcomes: tuple[str, ...],
        group: str,
    ) -> None:
        labels = ["lease_group"]
        Gauge(
            PREFIX + "app_up",
            "1 while the app beside this sidecar is up as its check says (--app-health-url, "
            "--app-heartbeat)",
            labels,
            registry=registry,
        ).labels(group).set_function(lambda: 1.0 if app_up() else 0.0)
        Gauge(
            PREFIX + "app_down_leading_seconds",
            "While this replica leads with its app down and no other replica's app is up: "
            "for how long; 0 otherwise",
            labels,
            registry=registry,
        ).labels(group).set_function(alone_seconds)
        self.checks = Counter(
            PREFIX + "app_checks",
            "App health checks by outcome (up, down, timeout, refused, redirect)",
            [*labels, "outcome"],
            registry=registry,
        ).labels
        self.handovers = Counter(
            PREFIX + "handovers",
            "Leases this replica stopped leading because of its app or an operator, by reason "
            "(app_down, drain, hold)",
            [*labels, "reason"],
            registry=registry,
        ).labels
        self.drains = Counter(
            PREFIX + "drains",
            "Drains on SIGTERM (503 while the app stops) by how they ended",
            [*labels, "outcome"],
            registry=registry,
        ).labels
        self.group = group
        for outcome in outcomes:  # zeros, so that increase() sees the first one
            self.checks(group, outcome)
        for reason in HANDOVER_REASONS:
            self.handovers(group, reason)
        for outcome in DRAIN_OUTCOMES:
            self.drains(group, outcome)

    def check(self, outcome: str) -> None:
        self.checks(self.group, outcome).inc()

    def handover(self, reason: str) -> None:
        self.handovers(self.group, reason).inc()

    def drain(self, outcome: str) -> None:
        self.drains(self.group, outcome).inc()


def for_config(config: Config, registry: CollectorRegistry) -> Callable[[str], Metrics]:
    """The sidecar's metrics of one lease, by the name it is shown under (``namespace/name``
    on Kubernetes): labelled with its `lease_group`, in the detail ``--metrics-per-lease``
    chose."""
    groups = {config.ref(name): config.ref(config.lease_group(name)) for name in config.lease_names}

    def metrics(lease: str) -> Metrics:
        return Metrics(
            registry,
            lease,
            config.timing.lease_duration,
            group=groups.get(lease, lease),
            per_lease=config.per_lease_metrics,
        )

    return metrics
