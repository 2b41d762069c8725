"""Prediction error: measured runs joined with the planner's predictions for the same setting."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

KEYS = ("model", "dataset", "strategy", "gpus", "network")
MEASURED = (*KEYS, "images_per_sec", "split")


def relative_error(predicted: pd.Series, measured: pd.Series) -> pd.Series:
    """(predicted - measured) / measured, element by element; NaN where either is missing or measured is 0."""
    return (predicted - measured) / measured.where(measured != 0)


def median_abs_error(errors: pd.Series) -> float:
    """Median absolute relative error over the rows that have one (NaN when none has)."""
    return float(errors.abs().median())


def prediction_error(
    measured: pd.DataFrame, predicted: pd.DataFrame, keys: tuple[str, ...] = KEYS, column: str = "images_per_sec"
) -> tuple[pd.DataFrame, float]:
    """Rows of `measured` with their prediction, relative error, and the median absolute relative error.

    Both frames hold `keys` and `column` (images/sec unless told); the relative error of a row
    is (predicted - measured) / measured. Measured runs without a prediction are refused,
    naming them, rather than silently dropped.
    """
    missing = [k for k in (*keys, column) if k not in measured.columns or k not in predicted.columns]
    if missing:
        raise ValueError(
            f"prediction_error needs columns {', '.join(missing)} in both frames "
            f"(measured has {list(measured.columns)}, predicted has {list(predicted.columns)})"
        )
    if predicted.duplicated(list(keys)).any():
        raise ValueError(
            f"more than one prediction per {', '.join(keys)}: {predicted[predicted.duplicated(list(keys))]}"
        )
    joined = measured.merge(predicted[[*keys, column]], on=list(keys), how="left", suffixes=("", "_predicted"))
    unmatched = joined[joined[f"{column}_predicted"].isna()]
    if len(unmatched):
        raise ValueError(f"no prediction for measured runs:\n{unmatched[list(keys)].to_string(index=False)}")
    joined = joined.rename(columns={column: f"{column}_measured"})
    joined["relative_error"] = relative_error(joined[f"{column}_predicted"], joined[f"{column}_measured"])
    joined["abs_relative_error"] = joined["relative_error"].abs()
    return joined, median_abs_error(joined["relative_error"])


def plan_predictions(plan: Mapping[str, Any]) -> pd.DataFrame:
    """One row per strategy and GPU count of a plan document, with the `KEYS` columns and images/sec."""
    rows = [
        {
            "model": plan["model"],
            "dataset": plan["dataset"],
            "strategy": name,
            "gpus": int(gpus),
            "network": plan["network"],
            "split": entry["split"],
            "images_per_sec": entry["predicted_images_per_sec"],
            "gb_per_step": entry["predicted_gb_per_step"]["total"],
        }
        for gpus, entries in plan["by_gpus"].items()
        for name, entry in entries.items()
    ]
    return pd.DataFrame(rows)
