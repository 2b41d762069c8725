"""Prediction error: how far the planner's prediction lies from the measurement, relatively."""

from __future__ import annotations

import pandas as pd


def relative_error(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    """(predicted - measured) / measured, element by element; NaN where either is missing or measured is 0."""
    return (predicted - measured) / measured.where(measured != 0)


def median_abs_error(errors: pd.Series) -> float:
    """Median absolute relative error over the rows that have one (NaN when none has)."""
    return float(errors.abs().median())
