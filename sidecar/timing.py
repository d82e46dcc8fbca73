"""Lease timing and its validation (like client-go's constructor): what the elector, the
scheduler and the stores need of the configuration, in a module of its own."""

from __future__ import annotations

import dataclasses

from sidecar.config_error import ConfigError

MAX_LEASE_SECONDS = 86_400.0
"""The longest lease a record may declare (``--lease-duration`` allows as much): longer, and
a record written once could keep the followers waiting for ever."""

# Rate drift a deadline allows between our monotonic clock and the store's (NTP slews at most
# 0.05 %; one per cent leaves room for a badly disciplined VM clock).
CLOCK_DRIFT = 0.01

DURATION_HELP = "must be a positive duration such as 15, 1.5, 1500ms, 2s or 1m"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Lease timing, validated on construction (like client-go's constructor)."""

    lease_duration: float = 15.0
    renew_interval: float = 5.0
    retry_period: float = 2.0
    request_timeout: float = 2.5

    @property
    def safety_margin(self) -> float:
        """Subtracted from every deadline: one request timeout plus clock-rate drift."""
        return self.request_timeout + CLOCK_DRIFT * self.lease_duration

    @property
    def handed_reach(self) -> float:
        """How old a candidate beat may be for a grant handed over by it to be led on: the
        successor's lease counts from that beat, less the safety margin, and must leave its
        first renewal a request timeout (`Elector._take_handed`); past it, the successor
        takes the lease with a write of its own."""
        return self.lease_duration - self.safety_margin - self.request_timeout

    @property
    def max_renew_interval(self) -> float:
        """Longest renew interval that still leaves one interval of margin after a failed
        renewal: lease - safety margin >= 2 * renew interval."""
        return (self.lease_duration - self.safety_margin) / 2

    @classmethod
    def build(
        cls,
        lease_duration: float = 15.0,
        renew_interval: float | None = None,
        retry_period: float | None = None,
        request_timeout: float | None = None,
    ) -> Timing:
        """Fill in the defaults that derive from the lease, then validate."""
        renew = renew_interval if renew_interval is not None else lease_duration / 3
        retry = retry_period if retry_period is not None else min(2.0, renew)
        timeout = request_timeout if request_timeout is not None else min(renew / 2, 5.0)
        timing = cls(lease_duration, renew, retry, timeout)
        timing.validate()
        return timing

    def validate(self) -> None:
        for flag, value in (
            ("--lease-duration", self.lease_duration),
            ("--renew-interval", self.renew_interval),
            ("--retry-period", self.retry_period),
            ("--request-timeout", self.request_timeout),
        ):
            if not value > 0:
                raise ConfigError(flag, _fmt(value), DURATION_HELP)
        if self.lease_duration > MAX_LEASE_SECONDS:
            # Longer, and the other sidecars could not read the records this one writes.
            raise ConfigError(
                "--lease-duration",
                _fmt(self.lease_duration),
                f"must be at most {_fmt(MAX_LEASE_SECONDS)} (24h)",
            )
        if self.request_timeout >= self.renew_interval:
            raise ConfigError(
                "--request-timeout",
                _fmt(self.request_timeout),
                f"must be shorter than the renew interval ({_fmt(self.renew_interval)}) so a "
                "hung request cannot swallow a renewal",
            )
        if self.renew_interval > self.max_renew_interval:
            raise ConfigError(
                "--renew-interval",
                _fmt(self.renew_interval),
                f"leaves less than one renew interval of margin before the "
                f"{_fmt(self.lease_duration)} lease runs out (less the {_fmt(self.safety_margin)} "
                f"safety margin: request timeout + clock drift); use at most "
                f"{_fmt(self.max_renew_interval)} or a longer --lease-duration",
            )
        if self.retry_period >= self.lease_duration:
            raise ConfigError(
                "--retry-period",
                _fmt(self.retry_period),
                f"must be shorter than the lease ({_fmt(self.lease_duration)})",
            )


def _fmt(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
