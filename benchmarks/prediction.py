"""Predicted vs measured throughput on this machine: profile -> plan -> real training runs.

Usage: python benchmarks/prediction.py [--models resnet18 vgg11] [--gpus 2] [--steps 5] [--out DIR]

For each model it profiles the model here, plans every strategy, runs `ralp-pipe train` for
each strategy with the plan (loopback, synthetic data, 2 warm-up + `--steps` measured steps)
and prints predicted vs measured images/sec side by side with the median absolute error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ralp_pipe.config import STRATEGIES
from ralp_pipe.results.accuracy import prediction_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness shared with the tests
from support.prediction import measure_against_plan  # noqa: E402

TARGET = 0.10  # the planner's median absolute error on this benchmark and on the default workflow


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11"])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ralp-prediction-"))
    measured, predicted = [], []
    for model in args.models:
        common = [
            f"model={model}",
            "dataset=synthetic1k",
            "network=loopback",
            "cluster=local",
            f"cluster.gpus={args.gpus}",
            f"train.batch_size={args.batch}",
            "train.image_size=32",
            "train.warmup_steps=2",
            f"train.measure_steps={args.steps}",
            "train.loader=synthetic",
        ]
        runs, plan = measure_against_plan(out / model, common, STRATEGIES, ["--repeats", "5"])
        measured.append(runs)
        predicted.append(plan)
    joined, median = prediction_error(pd.concat(measured, ignore_index=True), pd.concat(predicted, ignore_index=True))
    columns = [
        "model",
        "strategy",
        "gpus",
        "split",
        "images_per_sec_measured",
        "images_per_sec_predicted",
        "relative_error",
    ]
    print(joined[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    verdict = "met" if median <= TARGET else "NOT met"
    print(
        f"median absolute relative error of images/sec: {median:.1%} (target <= {TARGET:.0%}: {verdict}); files in {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
