"""Percentiles and the median-and-spread of repeated runs."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`-th percentile (0–100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def spread(runs: Sequence[float]) -> dict[str, float]:
    """The median of repeated runs with their minimum and maximum."""
    clean = [r for r in runs if not math.isnan(r)]
    if not clean:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "runs": len(runs)}
    ordered = sorted(clean)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1], "runs": len(runs)}


def fmt(value: float, digits: int = 1) -> str:
    """A number for the table ("–" for NaN)."""
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def fmt_spread(s: dict[str, float], digits: int = 1) -> str:
    """`median (min–max)`, or just the median for one run."""
    if s.get("runs", 1) <= 1 or math.isnan(s["median"]):
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}–{fmt(s['max'], digits)})"
