"""Figures and tables as Markdown text, as summary.md shows them."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd


def fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    """`value` with `digits` decimals and `suffix`; '-' where it is missing (None, NA or NaN)."""
    missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{value:.{digits}f}{suffix}"


def plus_minus(mean: float, low: float, high: float, digits: int = 1, suffix: str = "") -> str:
    """`mean ± half-width` of the interval [`low`, `high`] (just the mean where there is no interval)."""
    if math.isnan(low) or math.isnan(high) or low == high:
        return fmt(mean, digits, suffix)
    return f"{fmt(mean, digits)} ± {fmt((high - low) / 2, digits)}{suffix}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of `rows` under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
