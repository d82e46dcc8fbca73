"""The pieces every setting is made of: a flag with its ``LEADER_SIDECAR_*`` variable
(`Option`) and the value parsers. Below the configuration and the stores, so that each store
declares its own options without importing the configuration."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from sidecar.timing import DURATION_HELP

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


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str
    parse: Callable[[str], Any]
    help: str
    metavar: str = "VALUE"
    secret: bool = False
    """Its value is a secret: scrubbed from every log line and error (`sidecar.redact`)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help text at spaces only: argparse also breaks at hyphens, which split
    ``pip install 'leader-sidecar[postgresql]'`` into two lines nobody can paste."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


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


class VersionAction(argparse.Action):
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
