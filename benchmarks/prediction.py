"""Predicted vs measured throughput on this machine: profile -> plan -> real training runs.

Usage: python benchmarks/prediction.py [--models resnet18 vgg11] [--gpus 2] [--steps 5] [--repeats 3] [--out DIR]

For each model it profiles the model here, plans every strategy, runs `ralp-pipe train`
`--repeats` times for each strategy with the plan (loopback, synthetic data, 2 warm-up +
`--steps` measured steps; the repeats go round by round over the strategies) and prints
predicted vs the mean measured images/sec with its 95% t-interval over the repeats, the
relative error of the mean, and the median absolute error. Single runs of one configuration
differ by up to 30% here, so one run per strategy cannot tell a 10% error from noise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ralp_pipe.config import STRATEGIES
from ralp_pipe.results.intervals import mean_interval

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness shared with the tests
from support.prediction import KEYS, measure_against_plan, prediction_error  # noqa: E402

TARGET = 0.10  # the planner's median absolute error on this benchmark and on the default workflow


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11"])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="independent runs of every strategy")
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
        runs, plan = measure_against_plan(out / model, common, STRATEGIES, ["--repeats", "5"], args.repeats)
        measured.append(runs)
        predicted.append(plan)
    means = _means(pd.concat(measured, ignore_index=True))
    joined, median = prediction_error(means, pd.concat(predicted, ignore_index=True))
    low, high = joined.images_per_sec_measured - joined.half_width, joined.images_per_sec_measured + joined.half_width
    joined["in_interval"] = (joined.images_per_sec_predicted >= low) & (joined.images_per_sec_predicted <= high)
    columns = [
        "model",
        "strategy",
        "gpus",
        "split",
        "images_per_sec_measured",
        "half_width",
        "images_per_sec_predicted",
        "relative_error",
        "in_interval",
    ]
    print(joined[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    verdict = "met" if median <= TARGET else "NOT met"
    print(
        f"measured: mean of {args.repeats} run(s) +- 95% half-width; median absolute relative error of the "
        f"mean images/sec: {median:.1%} (target <= {TARGET:.0%}: {verdict}); files in {out}"
    )
    return 0


def _means(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: the mean images/sec over its repeats and the 95% half-width."""
    rows = []
    for key, group in runs.groupby(list(KEYS), sort=False):
        estimate = mean_interval(group.images_per_sec.tolist())
        rows.append(
            {
                **dict(zip(KEYS, key)),
                "split": group.split.iloc[0],
                "images_per_sec": estimate.mean,
                "half_width": estimate.half_width,
            }
        )
    return pd.DataFrame(rows)


if __name__ == "__main__":
    raise SystemExit(main())
