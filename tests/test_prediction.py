"""Predicted vs measured throughput on real runs of this machine: profile -> plan -> train -> prediction_error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ralp_pipe import cli
from ralp_pipe.validation import plan_predictions, prediction_error

COMMON = ["model=resnet18", "dataset=synthetic1k", "network=loopback", "cluster=local", "cluster.gpus=2",
          "train.batch_size=4", "train.image_size=32", "train.warmup_steps=1", "train.measure_steps=3",
          "train.loader=synthetic"]
STRATEGIES = ("ps", "allreduce", "ralp_n")


def test_predictions_of_runs_measured_here_are_joined_and_near_the_measurement(tmp_path: Path) -> None:
    profile, plan = tmp_path / "profile.json", tmp_path / "plan.json"
    assert cli.main(["profile", "--out", str(profile), "--repeats", "3", "--message-mb", "16", *COMMON]) == 0
    assert cli.main(["plan", "--profile", str(profile), "--out", str(plan), *COMMON]) == 0
    measured = []
    for strategy in STRATEGIES:
        run = tmp_path / strategy
        assert cli.main(["train", "--out", str(run), *COMMON, f"strategy={strategy}", f"strategy.plan={plan}"]) == 0
        metrics = json.loads((run / "metrics.json").read_text())
        measured.append({k: metrics[k] for k in ("model", "dataset", "strategy", "gpus", "network", "images_per_sec")})
    joined, median = prediction_error(pd.DataFrame(measured), plan_predictions(json.loads(plan.read_text())))
    assert sorted(joined.strategy) == sorted(STRATEGIES)
    assert (joined.images_per_sec_predicted > 0).all() and joined.relative_error.map(math.isfinite).all()
    # benchmarks/prediction.py holds the 20% target; this bound catches a model off by a factor
    # (the PS's gradient reduction, unpriced, once made VGG-11's ps prediction 2.9x the measurement)
    assert median < 0.5, joined[["strategy", "images_per_sec_measured", "images_per_sec_predicted"]]
