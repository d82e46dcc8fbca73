"""Statistics and the table: each row ``measure | ours | theirs | ratio``, median and p99."""

from __future__ import annotations

import math
from collections.abc import Sequence

Values = Sequence[float | None]  # None: did not happen within the trial's cap


def p99(values: Sequence[float]) -> float:
    """Nearest rank: with fewer than 100 trials, the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def duration(seconds: float, signed: bool = False) -> str:
    sign = "+" if signed and seconds > 0 else ""
    if abs(seconds) < 1:
        return (
            f"{sign}{seconds * 1000:.0f} ms"
            if abs(seconds) >= 0.01
            else f"{sign}{seconds * 1000:.1f} ms"
        )
    return f"{sign}{seconds:.2f} s"


class Cell:
    """One column of one row: the trials' values, how to print them, and a note."""

    def __init__(
        self,
        values: Values,
        kind: str = "duration",  # duration | signed | rate | mib | rps
        never: str = "never",
        note: str = "",
    ) -> None:
        self.values = list(values)
        self.kind = kind
        self.never = never
        self.note = note

    @property
    def happened(self) -> list[float]:
        return [v for v in self.values if v is not None]

    def fmt(self, value: float) -> str:
        if self.kind == "duration":
            return duration(value)
        if self.kind == "signed":
            return duration(value, signed=True)
        if self.kind == "mib":
            return f"{value:.0f} MiB"
        if self.kind == "rps":
            return f"{value / 1000:.1f} k/s"
        return f"{value:.1f}/s"

    def median(self) -> float | None:
        if not self.values or len(self.happened) * 2 <= len(self.values):
            return None
        ordered = sorted(self.values, key=lambda v: math.inf if v is None else v)
        return ordered[(len(ordered) - 1) // 2]  # type: ignore[return-value]

    def __str__(self) -> str:
        if not self.values:
            return self.note or "n/a"
        n = len(self.values)
        happened = self.happened
        if not happened:
            text = f"{self.never} (n={n})"
        else:
            median = self.median()
            med = self.fmt(median) if median is not None else self.never
            top = self.fmt(p99(happened)) if len(happened) == n else self.never
            text = f"{med} / {top}"
            if len(happened) < n:
                text += f" ({n - len(happened)} of {n}: {self.never})"
        return f"{text} {self.note}".strip()


def ratio(ours: Cell, theirs: Cell) -> str:
    a, b = ours.median(), theirs.median()
    if a is None or b is None or ours.kind == "signed" or b == 0 or a < 0 or b < 0:
        return "—"
    return f"{a / b:.2g}x"


Row = tuple[str, Cell, Cell]


def table(rows: Sequence[Row], columns: tuple[str, str, str] | None = None) -> str:
    """``columns``: the header's first three cells (default: measure (median / p99), ours,
    theirs)."""
    head = columns or ("measure (median / p99)", "ours", "theirs")
    lines = [f"| {head[0]} | {head[1]} | {head[2]} | ratio |", "|---|---|---|---|"]
    for measure, ours, theirs in rows:
        lines.append(f"| {measure} | {ours} | {theirs} | {ratio(ours, theirs)} |")
    return "\n".join(lines)
