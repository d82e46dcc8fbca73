"""Structured logs: one JSON object per line (or ``key=value`` text), on stderr.

Call sites pass fields as keywords through `log`, so every line carries the same keys for
the same event: ``log(logger, "info", "became leader", term=7, lease="default")``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sidecar.redact import printable

_FIELDS = "sidecar_fields"


class Throttle:
    """At most one line per ``interval`` seconds for one noisy event; the next line that goes
    out says how many were dropped in between (``suppressed=N``)."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.suppressed = 0
        self._next = float("-inf")

    def allow(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.interval
        return True

    def take_suppressed(self) -> int:
        count, self.suppressed = self.suppressed, 0
        return count


def log(logger: logging.Logger, level: str, message: str, **fields: Any) -> None:
    logger.log(logging.getLevelNamesMapping()[level.upper()], message, extra={_FIELDS: fields})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = dict(getattr(record, _FIELDS, {}))
    if record.exc_info:
        fields["error"] = logging.Formatter().formatException(record.exc_info)
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _unchanged(text: str) -> str:
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``json.dumps`` escapes every control character."""

    def __init__(self, scrub: Callable[[str], str] = _unchanged) -> None:
        super().__init__()
        self.scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        return self.scrub(json.dumps(line, default=str, separators=(",", ":")))


class TextFormatter(logging.Formatter):
    """``key=value`` pairs on one line: control characters in any part are escaped, so a
    newline in a value cannot start a forged line."""

    def __init__(self, scrub: Callable[[str], str] = _unchanged) -> None:
        super().__init__()
        self.scrub = scrub

    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(
            f"{printable(str(key))}={_text(value)}" for key, value in _fields(record).items()
        )
        message = printable(record.getMessage())
        head = f"{_timestamp(record)} {record.levelname.lower():7} {message}"
        return self.scrub(f"{head} {pairs}" if pairs else head)


def _text(value: Any) -> str:
    text = printable(str(value))
    return json.dumps(text) if (" " in text or "=" in text or not text) else text


def configure(
    log_format: str = "json", level: str = "info", scrub: Callable[[str], str] = _unchanged
) -> None:
    """Log to stderr; ``scrub`` removes secrets from every finished line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(scrub) if log_format == "json" else TextFormatter(scrub))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would print one line per /leader poll: keep it for debugging only.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
