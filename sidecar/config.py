"""Configuration: every flag, its ``LEADER_SIDECAR_*`` environment variable, parsing and
validation. Anything wrong stops the sidecar at start-up with exit status 2 and one line that
names the flag (or variable), the value and what is allowed."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import secrets
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.app_check import NO_APP_CHECK, AppCheckSettings, parse_health_url
from sidecar.backends import (
    STORES,
    default_store,
    parse_store,
    store_commands,
    store_help,
    store_of,
    store_options,
)
from sidecar.backends.description import NO_SETTINGS, Store, StoreSettings
from sidecar.config_error import ConfigError
from sidecar.limits import DEFAULT_LIMITS, Limits
from sidecar.options import (
    ENV_PREFIX,
    MAX_LEASES,
    HelpFormatter,
    HostPort,
    Option,
    Parser,
    VersionAction,
    add_options,
    parse_bool,
    parse_choice,
    parse_count,
    parse_duration,
    parse_duration_or_zero,
    parse_host_port,
    parse_identity,
    parse_lease_list,
    parse_name,
    parse_positive_count,
    parse_priority,
    parse_revision,
    parse_shards,
    parse_signal,
    parse_text,
    parse_url,
)
from sidecar.service_account import SERVICE_ACCOUNT_DIR
from sidecar.timing import Timing

__all__ = [  # (the parsers and HostPort as the tests import them from here too)
    "ENV_PREFIX",
    "OPTIONS",
    "Config",
    "HostPort",
    "Option",
    "load",
    "parse_duration",
    "parse_host_port",
]


def parse_app_health_url(text: str) -> str:
    return parse_health_url(text)


# -- the option table -------------------------------------------------------------------------


OPTIONS: tuple[Option, ...] = (
    Option("--store", parse_store, store_help(), "URL"),
    Option(
        "--lease",
        parse_lease_list,
        "lease name, or several separated by commas (required in a cluster; default 'default')",
        "NAME[,NAME…]",
    ),
    Option(
        "--shards",
        parse_shards,
        "split each lease into N shards: --lease jobs --shards 16 runs jobs-0 … jobs-15 "
        "(default: no shards)",
        "N",
    ),
    Option(
        "--group",
        parse_name,
        "the candidates that share these leases, balanced among themselves "
        "(default: the first --lease name)",
        "NAME",
    ),
    Option(
        "--priority",
        parse_priority,
        "preference as a successor when a leader hands over (transfer, shutdown): higher wins "
        "(default 0)",
        "N",
    ),
    Option(
        "--revision",
        parse_revision,
        "this replica's revision; on shutdown a leader prefers a replica of another revision "
        "(the newer one in a rolling update). The chart passes the pod-template-hash label",
        "REV",
    ),
    Option(
        "--transfer-timeout",
        parse_duration,
        "how long the others stand back for the successor a leader named (default: the "
        "request timeout)",
        "DURATION",
    ),
    Option(
        "--namespace",
        parse_name,
        "Kubernetes namespace of the Lease (default: POD_NAMESPACE, the kubeconfig "
        "context's namespace, the service account's, else 'default')",
        "NS",
    ),
    Option(
        "--identity",
        parse_identity,
        "identity prefix; a random suffix is always added (default: POD_NAME, else the hostname)",
        "ID",
    ),
    Option("--lease-duration", parse_duration, "how long a grant lasts (default 15s)", "DURATION"),
    Option(
        "--renew-interval",
        parse_duration,
        "how often the leader renews (default lease/3)",
        "DURATION",
    ),
    Option(
        "--retry-period",
        parse_duration,
        "follower retry period after errors, jittered "
        "(default 2s, or the renew interval if shorter)",
        "DURATION",
    ),
    Option(
        "--request-timeout",
        parse_duration,
        "timeout of one store request (default: half the renew interval, at most 5s)",
        "DURATION",
    ),
    Option("--listen", parse_host_port, "localhost API (default 127.0.0.1:4040)", "HOST:PORT"),
    Option(
        "--public-listen", parse_host_port, "metrics and probes (default 0.0.0.0:4041)", "HOST:PORT"
    ),
    # Limits, per listener (docs/security.md).
    Option(
        "--max-connections",
        parse_positive_count,
        "open connections per listener; past it the oldest quiet one makes room, "
        "else a 503 (default 256)",
        "N",
    ),
    Option(
        "--max-long-polls",
        parse_positive_count,
        "GET /leader?wait= requests held per listener; the next gets a 503 (default 64)",
        "N",
    ),
    Option(
        "--max-long-polls-per-peer",
        parse_positive_count,
        "long-polls held for one client address on the public listener; the next gets a 503 "
        "(default 8)",
        "N",
    ),
    Option(
        "--max-event-streams",
        parse_positive_count,
        "GET /events streams per listener; the next gets a 503 (default 16)",
        "N",
    ),
    Option(
        "--idle-timeout",
        parse_duration,
        "close a connection that sends no complete request head for this long (default 10s)",
        "DURATION",
    ),
    Option(
        "--metrics-per-lease",
        parse_bool,
        "label every metric by lease, not only those an alert reads per lease: true or false "
        "(default true without --shards, where each lease is a group of its own; false with "
        "--shards: 1,000 shards cost ~4,100 series instead of ~50,000)",
        "BOOL",
    ),
    Option("--log-format", parse_choice("json", "text"), "json or text (default json)", "FORMAT"),
    Option(
        "--log-level",
        parse_choice("debug", "info", "warning", "error"),
        "debug, info, warning or error (default info)",
        "LEVEL",
    ),
    # Leadership follows the app (docs/design.md): off unless one of these is given.
    Option(
        "--app-health-url",
        parse_app_health_url,
        "the app's health endpoint on this pod (loopback or POD_IP; 2xx = up): a replica "
        "whose app is down does not campaign, and a leader whose app goes down hands over",
        "URL",
    ),
    Option(
        "--app-health-period",
        parse_duration,
        "how often the app's health is checked (default 1s)",
        "DURATION",
    ),
    Option(
        "--app-health-timeout",
        parse_duration,
        "timeout of one app health check (default 1s)",
        "DURATION",
    ),
    Option(
        "--app-health-failures",
        parse_positive_count,
        "failed checks in a row before the app counts as down (default 3)",
        "N",
    ),
    Option(
        "--app-health-successes",
        parse_positive_count,
        "passed checks in a row before the app counts as up (default 1)",
        "N",
    ),
    Option(
        "--app-heartbeat",
        parse_duration,
        "the app is up while it called the localhost API within DURATION or holds a "
        "long-poll or event stream there (default: not used)",
        "DURATION",
    ),
    Option(
        "--drain-timeout",
        parse_duration_or_zero,
        "with an app check, on SIGTERM answer 503 at once but keep the lease until the app "
        "has stopped, at most this long (default: the lease duration; 0: release at once)",
        "DURATION",
    ),
    # Demotion actions (every store).
    Option(
        "--pod-name",
        parse_name,
        "this pod's name, for its role label and GET / (default POD_NAME, else the hostname)",
        "NAME",
    ),
    Option(
        "--role-label-key",
        parse_text,
        "pod label set to leader|follower on Kubernetes "
        "(default leader-sidecar/role; empty disables labelling)",
        "KEY",
    ),
    Option("--webhook-url", parse_url, "POST the state as JSON here on every transition", "URL"),
    Option(
        "--webhook-timeout", parse_duration, "timeout of one webhook call (default 2s)", "DURATION"
    ),
    Option(
        "--webhook-retries", parse_count, "webhook retries after the first try (default 3)", "N"
    ),
    Option(
        "--signal-process",
        parse_text,
        "send --signal to processes with this name when "
        "this replica stops leading (needs shareProcessNamespace)",
        "NAME",
    ),
    Option("--signal", parse_signal, "signal for --signal-process (default SIGTERM)", "SIG"),
    *store_options(),  # each store's own (sidecar.backends)
)


# -- the result -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    store: str
    lease: str
    """The first lease (the only one, unless several are configured)."""
    namespace: str
    identity: str
    timing: Timing
    listen: HostPort
    public_listen: HostPort
    limits: Limits = DEFAULT_LIMITS
    log_format: str = "json"
    log_level: str = "info"
    pod_name: str | None = None
    role_label_key: str = "leader-sidecar/role"
    webhook_url: str | None = None
    webhook_timeout: float = 2.0
    webhook_retries: int = 3
    signal_process: str | None = None
    signal: str = "SIGTERM"
    store_settings: StoreSettings = NO_SETTINGS
    """The chosen store's own settings (`sidecar.backends.description`)."""
    leases: tuple[str, ...] = ()
    """Every lease this sidecar competes for, shards expanded; () means just ``lease``."""
    group: str = ""
    """The candidates' group (default: the first configured lease name)."""
    priority: int = 0
    revision: str = ""
    transfer_timeout: float | None = None
    """None: the request timeout."""
    shards: int | None = None
    """--shards: every listed lease L runs as L-0 … L-(shards-1); None: no shards."""
    metrics_per_lease: bool | None = None
    """--metrics-per-lease; None: the default, `per_lease_metrics`."""
    app: AppCheckSettings = NO_APP_CHECK
    """How the sidecar knows its app is up (`sidecar.app_check`); not configured: as before."""
    drain_timeout: float = 0.0
    """On SIGTERM, how long a leader keeps the lease (answering 503) for its app to stop."""

    @property
    def lease_names(self) -> tuple[str, ...]:
        return self.leases or (self.lease,)

    @property
    def candidate_group(self) -> str:
        return self.group or self.lease

    def lease_group(self, lease: str) -> str:
        """The ``--lease`` name a lease was made from: ``jobs`` for the shard ``jobs-3``; a
        lease without shards is a group of its own. The metrics' ``lease_group`` label."""
        return lease.rpartition("-")[0] if self.shards is not None else lease

    @property
    def per_lease_metrics(self) -> bool:
        """Label every metric by lease, or (with shards, by default) only the per-lease ones:
        without shards every group is one lease and the detail costs no series."""
        if self.metrics_per_lease is not None:
            return self.metrics_per_lease
        return self.shards is None

    @property
    def stand_back(self) -> float:
        """How long the others leave a named successor to take a released lease."""
        if self.transfer_timeout is not None:
            return self.transfer_timeout
        return self.timing.request_timeout

    def ref(self, lease: str) -> str:
        """A lease as users name it: ``namespace/name`` in a store with namespaces, else the
        name."""
        return f"{self.namespace}/{lease}" if self.backend.namespaced else lease

    @property
    def backend(self) -> Store:
        """The chosen store's description."""
        return store_of(self.store)

    @property
    def lease_ref(self) -> str:
        return self.ref(self.lease)


# -- building it ------------------------------------------------------------------------------


def server_epilog() -> str:
    """The subcommands (the stores' own too), the optional extras, the exit statuses."""
    commands = [
        ("status", "holders, terms and candidates, read from the store"),
        ("transfer", "ask the sidecar on this host to hand its lease(s) over"),
        ("hold", "stop the job fleet-wide: nobody leads until resume"),
        ("resume", "end a hold: a replica whose app is up leads again"),
        *((command.name, command.summary) for command in store_commands().values()),
    ]
    extras = sorted(extra for store in STORES for extra in store.extras)
    return (
        "commands (each with its own --help):\n"
        + "".join(f"  leader-sidecar {name:<19}{summary}\n" for name, summary in commands)
        + "\noptional extras (a plain install has neither; without one, its store stops at "
        "start naming it):\n"
        + "".join(f"  {what:<41}{install}\n" for what, install in extras)
        + "\nexit status: 0 after SIGTERM/SIGINT (lease released), 1 if a listener cannot bind "
        "or the\nelection fails, 2 for bad configuration.\n"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar",
        description="Leader election next to your app: one lease, one leader, a fencing term\n"
        "on localhost. Every flag can also be set as LEADER_SIDECAR_<FLAG>, e.g.\n"
        "LEADER_SIDECAR_LEASE_DURATION=10s.",
        epilog=server_epilog(),
        formatter_class=HelpFormatter,
    )
    add_options(parser, OPTIONS)
    parser.add_argument("--version", action=VersionAction, nargs=0, help="print the version")
    return parser


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Flags win over ``LEADER_SIDECAR_*`` variables, which win over defaults.
    Raises `ConfigError`; argparse itself exits 2 on unknown flags."""
    environ = os.environ if environ is None else environ
    args = vars(build_parser().parse_args(argv))
    _refuse_unknown_env(environ)

    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw, source = args[option.dest], option.flag
        if raw is None and option.env in environ:
            raw, source = environ[option.env], option.env
        if raw is None:
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(source, raw, str(exc)) from None

    # The default is checked too: the embedded store's directory must be writable.
    store = values.get("store") or parse_store(default_store(environ))
    backend = store_of(store)
    listed = values.get("lease")
    lease = listed[0] if listed else None
    if lease is None:
        if backend.lease_required:
            raise ConfigError("--lease", "", backend.lease_required)
        lease = "default"
    group = values.get("group") or lease
    shards = values.get("shards")
    names = listed or (lease,)
    if shards is not None:
        names = tuple(f"{name}-{i}" for name in names for i in range(shards))
        if len(names) > MAX_LEASES:
            raise ConfigError(
                "--shards", shards, f"gives {len(names)} leases; at most {MAX_LEASES} in all"
            )
        for name in names:
            try:
                parse_name(name)
            except ValueError as exc:
                raise ConfigError(
                    "--shards", shards, f"makes the lease name {name} that {exc}"
                ) from None
        lease = names[0]
    if len(set(names)) != len(names):
        raise ConfigError("--lease", ",".join(listed or ()), "repeats a lease once shards expand")

    timing = Timing.build(
        values.get("lease_duration", 15.0),
        values.get("renew_interval"),
        values.get("retry_period"),
        values.get("request_timeout"),
    )
    listen = values.get("listen", HostPort("127.0.0.1", 4040))
    public_listen = values.get("public_listen", HostPort("0.0.0.0", 4041))
    if listen.port and listen.port == public_listen.port and _same_host(listen, public_listen):
        raise ConfigError("--public-listen", public_listen, f"must differ from --listen ({listen})")

    pod_name = values.get("pod_name") or environ.get("POD_NAME") or None
    prefix = values.get("identity") or pod_name or _hostname_prefix()
    for each in STORES:
        each.check_options(values, store)

    app = _app_check(values)
    drain_timeout = values.get("drain_timeout")
    if drain_timeout is None:
        drain_timeout = timing.lease_duration if app.configured else 0.0
    elif drain_timeout > 0 and not app.configured:
        raise ConfigError(
            "--drain-timeout",
            values["drain_timeout"],
            "needs --app-health-url or --app-heartbeat: without them the sidecar cannot tell "
            "when the app has stopped",
        )

    settings = backend.settings(values, environ)
    return Config(
        store=store,
        lease=lease,
        namespace=values.get("namespace") or _namespace(environ, settings.namespace),
        identity=f"{prefix}_{secrets.token_hex(4)}",
        timing=timing,
        listen=listen,
        public_listen=public_listen,
        limits=Limits(
            max_connections=values.get("max_connections", DEFAULT_LIMITS.max_connections),
            max_long_polls=values.get("max_long_polls", DEFAULT_LIMITS.max_long_polls),
            max_long_polls_per_peer=values.get(
                "max_long_polls_per_peer", DEFAULT_LIMITS.max_long_polls_per_peer
            ),
            max_event_streams=values.get("max_event_streams", DEFAULT_LIMITS.max_event_streams),
            idle_timeout=values.get("idle_timeout", DEFAULT_LIMITS.idle_timeout),
        ),
        log_format=values.get("log_format", "json"),
        log_level=values.get("log_level", "info"),
        pod_name=pod_name,
        role_label_key=values.get("role_label_key", "leader-sidecar/role"),
        webhook_url=values.get("webhook_url"),
        webhook_timeout=values.get("webhook_timeout", 2.0),
        webhook_retries=values.get("webhook_retries", 3),
        signal_process=values.get("signal_process") or None,
        signal=values.get("signal", "SIGTERM"),
        store_settings=settings,
        leases=names if len(names) > 1 else (),
        group=group,
        priority=values.get("priority", 0),
        revision=values.get("revision", ""),
        transfer_timeout=values.get("transfer_timeout"),
        shards=shards,
        metrics_per_lease=values.get("metrics_per_lease"),
        app=app,
        drain_timeout=drain_timeout,
    )


def _app_check(values: Mapping[str, Any]) -> AppCheckSettings:
    """The app check's flags, the probe's only with ``--app-health-url`` (a period with no
    URL would be a check the operator believes runs)."""
    url = values.get("app_health_url")
    if url is None:
        for dest in (
            "app_health_period", "app_health_timeout", "app_health_failures",
            "app_health_successes",
        ):  # fmt: skip
            if dest in values:
                flag = "--" + dest.replace("_", "-")
                raise ConfigError(flag, values[dest], "applies only with --app-health-url")
    return AppCheckSettings(
        health_url=url,
        period=values.get("app_health_period", 1.0),
        timeout=values.get("app_health_timeout", 1.0),
        failures=values.get("app_health_failures", 3),
        successes=values.get("app_health_successes", 1),
        heartbeat=values.get("app_heartbeat"),
    )


def _refuse_unknown_env(environ: Mapping[str, str]) -> None:
    """A misspelt variable would otherwise be ignored in silence, e.g. a lease of 15s instead
    of the 60s someone believes they set."""
    known = {option.env for option in OPTIONS}
    for name in environ:
        if name.startswith(ENV_PREFIX) and name not in known:
            import difflib

            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see --help for the variables"
            # Not the value: a misspelt LEADER_SIDECAR_…_PASSWROD holds a password.
            raise ConfigError(name, "", f"unknown setting; {hint}")


def _same_host(a: HostPort, b: HostPort) -> bool:
    wildcard = {"0.0.0.0", "::", ""}
    return a.host == b.host or a.host in wildcard or b.host in wildcard


def _namespace(environ: Mapping[str, str], context_namespace: str | None = None) -> str:
    """POD_NAMESPACE, else the one the store's configuration names (a kubeconfig context's,
    as kubectl), else the service account's, else 'default'."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    if context_namespace:
        return context_namespace
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


def _hostname_prefix() -> str:
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", socket.gethostname()).strip("-_.")
    return cleaned[:150] or "leader-sidecar"
