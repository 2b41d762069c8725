"""Harness of the prediction test and benchmark: profile, plan and train here, then join measured with predicted."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from ralp_pipe import cli
from ralp_pipe.results.accuracy import MEASURED, plan_predictions
from ralp_pipe.results.layout import METRICS_FILE
from ralp_pipe.results.records import Plan, RunMetrics


def measure_against_plan(
    out: Path, overrides: Sequence[str], strategies: Sequence[str], profile_args: Sequence[str] = ()
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile, plan and train each of `strategies` here with `overrides`, writing below `out`.

    Returns the measured runs (`MEASURED` columns) and the plan's predictions; a stage that
    fails raises, naming it.
    """
    profile, plan = out / "profile.json", out / "plan.json"
    stages = [
        ["profile", "--out", str(profile), *profile_args, *overrides],
        ["plan", "--profile", str(profile), "--out", str(plan), *overrides],
    ]
    stages += [
        ["train", "--out", str(out / s), *overrides, f"strategy={s}", f"strategy.plan={plan}"] for s in strategies
    ]
    for argv in stages:
        if cli.main(argv) != 0:
            raise RuntimeError(f"`ralp-pipe {' '.join(argv)}` failed")
    records = [RunMetrics.read(out / s / METRICS_FILE) for s in strategies]
    measured = pd.DataFrame([{k: getattr(record, k) for k in MEASURED} for record in records])
    return measured, plan_predictions(Plan.read(plan).to_dict())
