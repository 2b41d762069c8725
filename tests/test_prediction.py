"""Predicted vs measured throughput on real runs of this machine: profile -> plan -> train -> prediction_error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ralp_pipe.results.accuracy import prediction_error
from support.prediction import measure_against_plan

pytestmark = pytest.mark.slow  # profiles, plans and trains three strategies in subprocesses

COMMON = [
    # the sequential ps step: on one host's loopback the planner prices ps sequentially (transfers are
    # copies by the computing cores); the pipelined engine's accuracy there is not established yet
    "strategy.overlap=false",
    "model=resnet18",
    "dataset=synthetic1k",
    "network=loopback",
    "cluster=local",
    "cluster.gpus=2",
    "train.batch_size=4",
    "train.image_size=32",
    "train.warmup_steps=1",
    "train.measure_steps=3",
    "train.loader=synthetic",
]
STRATEGIES = ("ps", "allreduce", "ralp_n")


def test_predictions_of_runs_measured_here_are_joined_and_near_the_measurement(tmp_path: Path) -> None:
    """Every strategy's prediction is joined to its run, the median and each row near the measurement."""
    measured, predicted = measure_against_plan(tmp_path, COMMON, STRATEGIES, ["--repeats", "3", "--message-mb", "16"])
    joined, median = prediction_error(measured, predicted)
    assert sorted(joined.strategy) == sorted(STRATEGIES)
    assert (joined.images_per_sec_predicted > 0).all() and joined.relative_error.map(math.isfinite).all()
    # benchmarks/prediction.py holds the 20% target; this bound catches a model off by a factor
    # (the PS's gradient reduction, unpriced, once made VGG-11's ps prediction 2.9x the measurement)
    figures = joined[["strategy", "images_per_sec_measured", "images_per_sec_predicted", "relative_error"]]
    assert median < 0.5, figures
    # The median of 3 rows hides one row off by any factor. |error| < 1 bounds every row: a prediction
    # at 2x the measurement or more (the 2.9x above) fails. An under-prediction has error > -1 anyway, so
    # the bound only limits over-prediction; it is 2x the median's bound because a single run on this
    # shared 2-core machine is noisier than the median of three.
    assert (joined.relative_error.abs() < 1.0).all(), figures
