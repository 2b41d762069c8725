"""Predicted vs measured throughput on real runs of this machine: profile -> plan -> train -> prediction_error."""

from __future__ import annotations

import math
from pathlib import Path

from ralp_pipe.results.accuracy import measure_against_plan, prediction_error

COMMON = ["model=resnet18", "dataset=synthetic1k", "network=loopback", "cluster=local", "cluster.gpus=2",
          "train.batch_size=4", "train.image_size=32", "train.warmup_steps=1", "train.measure_steps=3",
          "train.loader=synthetic"]
STRATEGIES = ("ps", "allreduce", "ralp_n")


def test_predictions_of_runs_measured_here_are_joined_and_near_the_measurement(tmp_path: Path) -> None:
    measured, predicted = measure_against_plan(tmp_path, COMMON, STRATEGIES, ["--repeats", "3", "--message-mb", "16"])
    joined, median = prediction_error(measured, predicted)
    assert sorted(joined.strategy) == sorted(STRATEGIES)
    assert (joined.images_per_sec_predicted > 0).all() and joined.relative_error.map(math.isfinite).all()
    # benchmarks/prediction.py holds the 20% target; this bound catches a model off by a factor
    # (the PS's gradient reduction, unpriced, once made VGG-11's ps prediction 2.9x the measurement)
    assert median < 0.5, joined[["strategy", "images_per_sec_measured", "images_per_sec_predicted"]]
