"""What the emulated-cluster benchmarks share: one `ralp-pipe train` run, kept when already done."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

WORKERS, BATCH_SIZE, IMAGE_SIZE = 4, 4, 32  # the emulated benchmarks' N, per-worker batch and image side


def emulated_recipe(rate: str, steps: int) -> list[str]:
    """Overrides of the benchmarks' runs: N=4 on the emulated cluster at `rate`, 1 warm-up + `steps` measured,
    synthetic input (the step's compute and communication, not the input pipeline)."""
    return [
        "cluster=emulated",
        f"network={rate}",
        f"cluster.gpus={WORKERS}",
        f"train.batch_size={BATCH_SIZE}",
        f"train.image_size={IMAGE_SIZE}",
        "train.warmup_steps=1",
        f"train.measure_steps={steps}",
        "train.loader=synthetic",
    ]


def train(out: Path, overrides: list[str]) -> dict[str, Any]:
    """Run `ralp-pipe train` into `out` unless it already holds a finished run; return its metrics.json."""
    if not (out / "metrics.json").exists():
        subprocess.run([sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *overrides], check=True)
    return json.loads((out / "metrics.json").read_text())


def measured_steps(out: Path) -> pd.DataFrame:
    """The measured (not warm-up) step rows of the run in `out`."""
    steps = pd.read_parquet(out / "steps.parquet")
    return steps[steps.phase == "measure"]
