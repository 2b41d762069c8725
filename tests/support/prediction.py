"""Harness of the prediction test and benchmark: profile, plan and train here, then join measured with predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from ralp_pipe import cli
from ralp_pipe.contract.layout import METRICS_FILE
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.results.accuracy import median_abs_error, relative_error

KEYS = ("model", "dataset", "strategy", "gpus", "network")
MEASURED = (*KEYS, "images_per_sec", "split")


def measure_against_plan(
    out: Path,
    overrides: Sequence[str],
    strategies: Sequence[str],
    profile_args: Sequence[str] = (),
    repeats: int = 1,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile, plan and train each of `strategies` `repeats` times here with `overrides`, writing below `out`.

    Returns the measured runs (`MEASURED` columns and `repeat`, one row per run; the repeats of a
    strategy follow each other round by round, so slow drift of the host spreads over all of them)
    and the plan's predictions; a stage that fails raises, naming it.
    """
    profile, plan = out / "profile.json", out / "plan.json"
    stages = [
        ["profile", "--out", str(profile), *profile_args, *overrides],
        ["plan", "--profile", str(profile), "--out", str(plan), *overrides],
    ]
    runs = [(s, r, out / s if repeats == 1 else out / s / f"r{r}") for r in range(repeats) for s in strategies]
    stages += [
        ["train", "--out", str(folder), *overrides, f"strategy={s}", f"strategy.plan={plan}", f"train.repeat={r}"]
        for s, r, folder in runs
    ]
    for argv in stages:
        if cli.main(argv) != 0:
            raise RuntimeError(f"`ralp-pipe {' '.join(argv)}` failed")
    rows = []
    for _, r, folder in runs:
        record = RunMetrics.read(folder / METRICS_FILE)
        rows.append({**{k: getattr(record, k) for k in MEASURED}, "repeat": r})
    return pd.DataFrame(rows), plan_predictions(Plan.read(plan).to_dict())


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
