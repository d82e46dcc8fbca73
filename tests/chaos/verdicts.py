"""The runs' one-line verdicts, collected for the end of the session (conftest prints them)."""

from __future__ import annotations

VERDICTS: dict[str, list[str]] = {}


def record_verdict(store: str, size: int, seed: int, verdict: str) -> None:
    VERDICTS.setdefault(store, []).append(f"n={size} seed={seed}: {verdict}")
