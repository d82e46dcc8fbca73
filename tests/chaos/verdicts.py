"""The runs' one-line verdicts, collected for the end of the session (conftest prints them)."""

from __future__ import annotations

VERDICTS: dict[str, list[str]] = {}


def record_verdict(store: str, run: str, seed: int, verdict: str) -> None:
    """``run``: ``n=3``, ``n=5`` or ``n=5x16`` (sharded)."""
    VERDICTS.setdefault(store, []).append(f"{run} seed={seed}: {verdict}")
