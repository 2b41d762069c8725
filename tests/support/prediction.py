"""Harness of the prediction test and benchmark: profile, plan and train here, then join measured with predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from ralp_pipe import cli
from ralp_pipe.contract.layout import METRICS_FILE
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.results.accuracy import MEASURED, plan_predictions


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
