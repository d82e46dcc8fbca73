"""Structured logs: one JSON object per line (or ``key=value`` text), on stderr.

Call sites pass fields as keywords through `log`, so every line carries the same keys for
the same event: ``log(logger, "info", "became leader", term=7, lease="default")``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        return json.dumps(line, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        pairs = " ".join(f"{key}={_text(value)}" for key, value in _fields(record).items())
        head = f"{_timestamp(record)} {record.levelname.lower():7} {record.getMessage()}"
        return f"{head} {pairs}" if pairs else head


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or "=" in text or not text) else text


def configure(log_format: str = "json", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would print one line per /leader poll: keep it for debugging only.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
