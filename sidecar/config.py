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
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sidecar.app_check import NO_APP_CHECK, AppCheckSettings, parse_health_url
from sidecar.config_error import ConfigError
from sidecar.limits import DEFAULT_LIMITS, Limits
from sidecar.service_account import SERVICE_ACCOUNT_DIR
from sidecar.timing import DURATION_HELP, Timing

ENV_PREFIX = "LEADER_SIDECAR_"


# -- value parsers: each raises ValueError whose message says what is allowed ----------------

# Durations also arrive in requests (``GET /leader?wait=``), so parsing one must cost the same
# small, bounded time for any input: a length cap first, then one pass over ASCII characters.
# No regular expression: the one used before backtracked quadratically on a digit followed by
# thousands of spaces (a URL-encoded ``+``), and a handful of such requests stalled the loop.
MAX_DURATION_CHARS = 32
_UNIT = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() and float() take any script's


def duration_seconds(text: str) -> float | None:
    """``1.5`` / ``1500ms`` / ``2s`` / ``1m`` / ``1h`` (blanks around it allowed) → seconds,
    0 included; None for anything else. Runs in time bounded by `MAX_DURATION_CHARS`."""
    if len(text) > MAX_DURATION_CHARS:
        return None
    body = text.strip(" \t")
    split = len(body)
    while split > 0 and body[split - 1] in "mhs":
        split -= 1
    unit = body[split:]
    number = body[:split].rstrip(" \t")
    if unit not in _UNIT or not number or number.count(".") > 1:
        return None
    if not set(number) <= _DIGITS | {"."} or number == ".":
        return None
    return float(number) * _UNIT[unit]


def parse_duration(text: str) -> float:
    """A duration for a flag: like `duration_seconds`, and more than zero."""
    seconds = duration_seconds(text)
    if seconds is None or seconds <= 0:
        raise ValueError(DURATION_HELP)
    return seconds


def parse_duration_or_zero(text: str) -> float:
    """A duration where 0 means "none" (``--drain-timeout 0``)."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise ValueError("must be 0 or a duration such as 15, 1.5, 1500ms, 2s or 1m")
    return seconds


def parse_app_health_url(text: str) -> str:
    return parse_health_url(text)


@dataclasses.dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str) -> HostPort:
    allowed = "must be HOST:PORT with a port from 0 to 65535, e.g. 127.0.0.1:4040 or [::1]:4040"
    match = re.fullmatch(
        r"\[(?P<v6>[0-9a-fA-F:.]+)\]:(?P<p1>\d+)|(?P<host>[^:\[\]\s]+):(?P<p2>\d+)", text
    )
    if not match:
        raise ValueError(allowed)
    port = int(match["p1"] or match["p2"])
    if not 0 <= port <= 65535:
        raise ValueError(allowed)
    return HostPort(match["v6"] or match["host"], port)


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


def parse_count(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise ValueError("must be a whole number, 0 or more")
    return int(text)


def parse_positive_count(text: str) -> int:
    digits = text.strip()
    count = int(digits) if len(digits) <= 9 and digits.isascii() and digits.isdigit() else 0
    if count < 1:
        raise ValueError("must be a whole number, 1 or more")
    return count


def parse_name(text: str) -> str:
    # A Kubernetes object name (DNS subdomain) is the strictest of our stores; one rule for all
    # keeps a lease portable between stores.
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", text):
        raise ValueError(
            "must be a lowercase DNS name: a-z, 0-9, '-' and '.', starting and ending "
            "alphanumeric, at most 253 characters"
        )
    return text


MAX_LEASES = 10_000  # per sidecar, shards included: bounded memory whatever the flags say


def parse_lease_list(text: str) -> tuple[str, ...]:
    """``jobs`` or ``jobs,billing``: one or more lease names, each a DNS name, no repeats."""
    names = tuple(part.strip() for part in text.split(",", MAX_LEASES))
    if len(names) > MAX_LEASES:
        raise ValueError(f"at most {MAX_LEASES} leases")
    for name in names:
        try:
            parse_name(name)
        except ValueError as exc:
            raise ValueError(f"each comma-separated name {exc}") from None
    if len(set(names)) != len(names):
        raise ValueError("names a lease twice; list each lease once")
    return names


def parse_shards(text: str) -> int:
    count = parse_positive_count(text)
    if count > MAX_LEASES:
        raise ValueError(f"must be from 1 to {MAX_LEASES}")
    return count


def parse_priority(text: str) -> int:
    value = text.strip()
    digits = value.removeprefix("-")
    if not (0 < len(digits) <= 9 and digits.isascii() and digits.isdigit()):
        raise ValueError("must be a whole number such as 0, 10 or -5 (at most 9 digits)")
    return int(value)


def parse_revision(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{0,63}", text):
        raise ValueError("must be at most 63 characters from A-Z a-z 0-9 . _ -")
    return text


def parse_identity(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,190}", text):
        raise ValueError("must be 1-191 characters from A-Z a-z 0-9 - _ . starting alphanumeric")
    return text


def parse_text(text: str) -> str:
    return text


def parse_url(text: str) -> str:
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8080/leader")
    return text


def parse_signal(text: str) -> str:
    import signal

    name = text.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if not isinstance(getattr(signal, name, None), signal.Signals):
        raise ValueError("must be a signal name such as SIGTERM, SIGUSR1 or HUP")
    return name


STORE_SCHEMES = (
    "kubernetes",
    "sqlite",
    "redis",
    "rediss",
    "redis+sentinel",
    "etcd",
    "etcds",
    "postgresql",
)
_STORE_HELP = (
    "must be kubernetes, sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "redis://[user:password@]host:port/db, rediss://... or "
    "redis+sentinel://host:port[,host:port]/master-name[/db], "
    "etcd://host:2379[,host:2379…][/key-prefix] or etcds://..., "
    "postgresql://[user@]host[:port][,host[:port]]/dbname[?sslmode=…]"
)


def parse_store(text: str) -> str:
    value = text.strip()
    if value == "kubernetes":
        return value
    try:
        parsed = urllib.parse.urlsplit(value)
        port_ok = all(_port_ok(hp) for hp in parsed.netloc.rpartition("@")[2].split(",") if hp)
    except ValueError:
        raise ValueError(_STORE_HELP) from None
    if parsed.scheme == "sqlite":
        from sidecar.backends.sqlite import never_works, sqlite_path

        path = Path(sqlite_path(value))
        if reason := never_works(str(path)):
            raise ValueError(reason)
        if not path.parent.is_dir():
            raise ValueError(
                f"the directory {path.parent} does not exist; create it or pick another path"
            )
        if not os.access(path.parent, os.W_OK):
            raise ValueError(f"the directory {path.parent} is not writable by this user")
        return value
    if parsed.scheme in ("redis", "rediss", "redis+sentinel") and parsed.netloc and port_ok:
        if parsed.scheme == "redis+sentinel" and not parsed.path.strip("/"):
            raise ValueError(
                "a redis+sentinel:// URL needs the master name as its path: " + _STORE_HELP
            )
        return value
    if parsed.scheme in ("postgresql", "postgres"):
        from sidecar.backends.postgresql.target import missing_driver, parse_target

        try:
            parse_target(value)
        except ConfigError as exc:
            raise ValueError(exc.allowed) from None
        if reason := missing_driver():
            raise ValueError(reason)
        return value
    if parsed.scheme in ("etcd", "etcds") and parsed.netloc and port_ok:
        return value
    raise ValueError(_STORE_HELP)


def _port_ok(host_port: str) -> bool:
    host, _, port = host_port.rpartition(":")
    if not host:
        return True  # no port: the scheme's default
    return port.isdigit() and 0 < int(port) <= 65535


# -- the option table -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], Any]
    help: str
    metavar: str = "VALUE"

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "--store",
        parse_store,
        "where the lease lives: kubernetes, sqlite:///PATH, redis://…, rediss://…, "
        "redis+sentinel://…, etcd://…, etcds://…, postgresql://… (default: kubernetes in a "
        "cluster, else sqlite:///./leader-sidecar.db). postgresql:// needs the [postgresql] "
        "extra: pip install 'leader-sidecar[postgresql]'",
        "URL",
    ),
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
    # Kubernetes.
    Option(
        "--kubeconfig",
        parse_text,
        "kubeconfig file outside a cluster (default KUBECONFIG, else in-cluster service "
        "account); one whose user runs an exec plugin or auth-provider needs the "
        "[kubeconfig-exec] extra: pip install 'leader-sidecar[kubeconfig-exec]'",
        "PATH",
    ),
    # Redis.
    Option("--redis-username", parse_text, "Redis ACL user (overrides the URL's)", "USER"),
    Option(
        "--redis-password",
        parse_text,
        "Redis password (overrides the URL's; prefer the environment variable)",
        "PASSWORD",
    ),
    Option(
        "--redis-ca-file",
        parse_text,
        "CA bundle that signs the Redis server certificate (rediss://)",
        "PATH",
    ),
    Option("--redis-cert-file", parse_text, "client certificate for Redis TLS", "PATH"),
    Option("--redis-key-file", parse_text, "client key for Redis TLS", "PATH"),
    Option(
        "--redis-sentinel-password",
        parse_text,
        "password of the Sentinels themselves (redis+sentinel://; prefer the env variable)",
        "PASSWORD",
    ),
    Option(
        "--redis-min-replicas",
        parse_count,
        "a grant counts only after this many replicas acknowledged it (WAIT); default 0",
        "N",
    ),
    # etcd.
    Option("--etcd-username", parse_text, "etcd user (overrides the URL's)", "USER"),
    Option(
        "--etcd-password",
        parse_text,
        "etcd user's password (overrides the URL's; prefer the environment variable)",
        "PASSWORD",
    ),
    Option(
        "--etcd-ca-file",
        parse_text,
        "CA bundle that signs the etcd members' certificates (etcds://)",
        "PATH",
    ),
    Option("--etcd-cert-file", parse_text, "client certificate for etcd TLS", "PATH"),
    Option("--etcd-key-file", parse_text, "client key for etcd TLS", "PATH"),
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
    kubeconfig: str | None = None
    redis_username: str | None = None
    redis_password: str | None = dataclasses.field(default=None, repr=False)
    redis_ca_file: str | None = None
    redis_cert_file: str | None = None
    redis_key_file: str | None = None
    redis_min_replicas: int = 0
    redis_sentinel_password: str | None = dataclasses.field(default=None, repr=False)
    etcd_username: str | None = None
    etcd_password: str | None = dataclasses.field(default=None, repr=False)
    etcd_ca_file: str | None = None
    etcd_cert_file: str | None = None
    etcd_key_file: str | None = None
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
        """A lease as users name it: ``namespace/name`` on Kubernetes, else the name."""
        return f"{self.namespace}/{lease}" if self.store == "kubernetes" else lease

    @property
    def lease_ref(self) -> str:
        return self.ref(self.lease)

    @property
    def store_scheme(self) -> str:
        return self.store.partition(":")[0]


# -- building it ------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2), not argparse's usage block; the server's and
    every subcommand's parser."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self._joined(args), namespace)

    def _joined(self, args: Sequence[str] | None) -> list[str]:
        """``--lease-duration -5s`` as ``--lease-duration=-5s``: argparse takes a value that
        starts with ``-`` (and is not a plain negative number) for a flag and answers
        "expected one argument", hiding the line that says what is wrong with the value.
        Only a flag that takes one value is joined, and never with a word that is itself a
        flag, so a flag given without its value still gets argparse's own message."""
        words = list(sys.argv[1:] if args is None else args)
        flags = self._option_string_actions
        joined: list[str] = []
        index = 0
        while index < len(words):
            word = words[index]
            action = flags.get(word)
            value = words[index + 1] if index + 1 < len(words) else None
            if (
                action is not None
                and action.nargs is None
                and value is not None
                and value.startswith("-")
                and value.partition("=")[0] not in flags
                and value != "--"
            ):
                joined.append(f"{word}={value}")
                index += 2
                continue
            joined.append(word)
            index += 1
        return joined


SERVER_EPILOG = """\
commands (each with its own --help):
  leader-sidecar status             holders, terms and candidates, read from the store
  leader-sidecar transfer           ask the sidecar on this host to hand its lease(s) over
  leader-sidecar hold               stop the job fleet-wide: nobody leads until resume
  leader-sidecar resume             end a hold: a replica whose app is up leads again
  leader-sidecar postgresql-schema  create the PostgreSQL store's schema and grants

optional extras (a plain install has neither; without one, its store stops at start naming it):
  --store postgresql://...                 pip install 'leader-sidecar[postgresql]'
  a --kubeconfig with an exec plugin       pip install 'leader-sidecar[kubeconfig-exec]'

exit status: 0 after SIGTERM/SIGINT (lease released), 1 if a listener cannot bind or the
election fails, 2 for bad configuration.
"""


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """The settings as flags, each naming its environment variable."""
    for option in options:
        parser.add_argument(
            option.flag,
            dest=option.dest,
            metavar=option.metavar,
            default=None,
            help=f"{option.help} [env {option.env}]",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="leader-sidecar",
        description="Leader election next to your app: one lease, one leader, a fencing term\n"
        "on localhost. Every flag can also be set as LEADER_SIDECAR_<FLAG>, e.g.\n"
        "LEADER_SIDECAR_LEASE_DURATION=10s.",
        epilog=SERVER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, OPTIONS)
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version")
    return parser


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked for: reading the installed distributions'
    metadata costs ~10-20 ms of every start otherwise."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(f"{parser.prog} {_version()}")  # to stdout, as argparse's own version action
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leader-sidecar")
    except PackageNotFoundError:
        return "unknown"


def in_cluster(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


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

    cluster = in_cluster(environ)
    store = values.get("store") or ("kubernetes" if cluster else "sqlite:///./leader-sidecar.db")
    if store == "sqlite:///./leader-sidecar.db":
        parse_store(store)  # the default path must be writable too
    listed = values.get("lease")
    lease = listed[0] if listed else None
    if lease is None:
        if store == "kubernetes":
            raise ConfigError(
                "--lease",
                "",
                "is required with the kubernetes store: the name of "
                "the Lease object, e.g. --lease my-app",
            )
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
    for dest in (
        "redis_cert_file", "redis_key_file", "redis_ca_file", "kubeconfig",
        "etcd_cert_file", "etcd_key_file", "etcd_ca_file",
    ):  # fmt: skip
        path = values.get(dest)
        if path and not Path(path).is_file():
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(flag, path, "no such file; give the path of a readable file")
    if bool(values.get("redis_cert_file")) != bool(values.get("redis_key_file")):
        raise ConfigError(
            "--redis-key-file",
            values.get("redis_key_file") or "",
            "--redis-cert-file and --redis-key-file go together; give both or neither",
        )
    if bool(values.get("etcd_cert_file")) != bool(values.get("etcd_key_file")):
        raise ConfigError(
            "--etcd-key-file",
            values.get("etcd_key_file") or "",
            "--etcd-cert-file and --etcd-key-file go together; give both or neither",
        )
    if values.get("redis_min_replicas") and not store.startswith(("redis", "rediss")):
        raise ConfigError(
            "--redis-min-replicas", values["redis_min_replicas"], "only applies to a redis store"
        )

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

    kubeconfig = values.get("kubeconfig") or environ.get("KUBECONFIG") or None
    context_namespace = None
    if store == "kubernetes" and kubeconfig is not None:
        source = "--kubeconfig" if values.get("kubeconfig") else "KUBECONFIG"
        context_namespace = _kubeconfig_namespace(source, kubeconfig)
    return Config(
        store=store,
        lease=lease,
        namespace=values.get("namespace") or _namespace(environ, context_namespace),
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
        kubeconfig=kubeconfig,
        redis_username=values.get("redis_username"),
        redis_password=values.get("redis_password"),
        redis_ca_file=values.get("redis_ca_file"),
        redis_cert_file=values.get("redis_cert_file"),
        redis_key_file=values.get("redis_key_file"),
        redis_min_replicas=values.get("redis_min_replicas", 0),
        redis_sentinel_password=values.get("redis_sentinel_password"),
        etcd_username=values.get("etcd_username"),
        etcd_password=values.get("etcd_password"),
        etcd_ca_file=values.get("etcd_ca_file"),
        etcd_cert_file=values.get("etcd_cert_file"),
        etcd_key_file=values.get("etcd_key_file"),
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
            # Not the value: a misspelt LEADER_SIDECAR_REDIS_PASSWROD holds a password.
            raise ConfigError(name, "", f"unknown setting; {hint}")


def _same_host(a: HostPort, b: HostPort) -> bool:
    wildcard = {"0.0.0.0", "::", ""}
    return a.host == b.host or a.host in wildcard or b.host in wildcard


def _kubeconfig_namespace(source: str, kubeconfig: str) -> str | None:
    """The current context's namespace (what kubectl would use), read now so that a kubeconfig
    that cannot work stops the sidecar at start with its reason, not later as a store that
    never answers."""
    from sidecar.backends.kubernetes.kubeconfig import Kubeconfig, KubeconfigError

    try:
        config = Kubeconfig.read(kubeconfig)
    except KubeconfigError as exc:
        raise ConfigError(source, kubeconfig, str(exc)) from None
    if reason := config.plugin_unavailable():
        raise ConfigError(source, kubeconfig, reason)
    return config.namespace


def _namespace(environ: Mapping[str, str], context_namespace: str | None = None) -> str:
    """POD_NAMESPACE, else the kubeconfig context's (as kubectl), else the service account's,
    else 'default'."""
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
