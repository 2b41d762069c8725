"""Predicted vs measured throughput on real runs of this machine: profile -> plan -> train -> prediction_error."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from support.prediction import measure_against_plan, prediction_error

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
    # 64 px: compute is about half of ps's step, so the loopback link, whose probe reads 2.4-3.6 GB/s
    # from one probe to the next on this host, moves the ps prediction by at most ~15% (at 32 px, with
    # the link two thirds of the step, a low probe alone put ps's speedup error at 0.3-0.5)
    "train.image_size=64",
    # 2 + 6 steps: with 1 + 3, one full-suite run measured ralp_n's speedup 0.79 where 5 runs alone gave
    # it near its prediction (a step's noise on a loaded host is a third of a 3-step window)
    "train.warmup_steps=2",
    "train.measure_steps=6",
    "train.loader=synthetic",
]
STRATEGIES = ("ps", "allreduce", "ralp_n")


def test_predictions_of_runs_measured_here_are_joined_and_near_the_measurement(tmp_path: Path) -> None:
    """Every strategy's prediction is joined to its run; each row and each speedup over ps near the measurement."""
    measured, predicted = measure_against_plan(tmp_path, COMMON, STRATEGIES, ["--repeats", "3", "--message-mb", "16"])
    joined, _ = prediction_error(measured, predicted)
    assert sorted(joined.strategy) == sorted(STRATEGIES)
    assert (joined.images_per_sec_predicted > 0).all() and joined.relative_error.map(math.isfinite).all()
    figures = joined[["strategy", "images_per_sec_measured", "images_per_sec_predicted", "relative_error"]]
    # |error| < 1 bounds every row: a prediction at 2x the measurement or more fails (the PS's gradient
    # reduction, unpriced, once made VGG-11's ps prediction 2.9x the measurement). An under-prediction
    # has error > -1 anyway, so this only limits over-prediction. benchmarks/prediction.py holds the
    # 10% target on a quiet machine; absolute images/sec here follow the shared host's speed, which
    # drifted 1.8x between a profile and the runs after it (a CI run: link 3.47 GB/s and the ps
    # server 0.058 s/step, against 1.9 GB/s and 0.103 s/step a session later; measured throughput
    # the same), so no tighter absolute bound holds here.
    assert (joined.relative_error.abs() < 1.0).all(), figures
    # Speedups over ps, the planner's decision, cancel the host's speed: measured and predicted
    # ratios of runs minutes apart. Runs here drift up to 20% between each other, and allreduce is
    # predicted 10-30% high on two shared cores (its all-reduce's copies compete with backward, which
    # the model does not price; benchmarks/prediction.py shows it), so the bound is a factor: each
    # predicted speedup within 1.6x of the measured one, either way. A strategy priced 2x off fails
    # (before freed memory was kept, the PS device's compute profiled 1.9x slow: speedup 0.53x).
    by_strategy = joined.set_index("strategy")
    speedups = by_strategy.drop(index="ps")
    measured_speedup = speedups.images_per_sec_measured / by_strategy.at["ps", "images_per_sec_measured"]
    predicted_speedup = speedups.images_per_sec_predicted / by_strategy.at["ps", "images_per_sec_predicted"]
    factor = predicted_speedup / measured_speedup
    assert ((factor < 1.6) & (factor > 1 / 1.6)).all(), pd.DataFrame(
        {"measured": measured_speedup, "predicted": predicted_speedup, "predicted/measured": factor}
    )
