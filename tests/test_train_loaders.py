"""`train` with `train.loader=dali` and `torchvision` on shards `prepare-shards` made (the paper experiment's input path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ralp_pipe.config import load
from ralp_pipe.contract.layout import METRICS_FILE
from ralp_pipe.data.shards import output_dir, read_manifest
from support.procs import descendants

pytestmark = pytest.mark.slow  # prepare-shards and two training runs in subprocesses (115 s at load 12 on 2 cores)

CLI = [sys.executable, "-m", "ralp_pipe.cli"]
TRAIN = [
    "cluster=local",
    "strategy=allreduce",
    "cluster.gpus=2",
    "model=resnet18",
    "train.batch_size=2",
    "train.image_size=32",
    "train.warmup_steps=1",
    "train.measure_steps=2",
    "train.loader_threads=1",
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Overrides of an ImageNet-style class-folder tree (3 classes x 4 JPEGs) whose shards `prepare-shards` wrote."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for label in range(3):
        folder = root / "train" / f"n{label:08d}"
        folder.mkdir(parents=True)
        for number in range(4):
            pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"n{label:08d}_{number}.JPEG")
    overrides = [
        "dataset=imagenet1k",
        f"dataset.source={root / 'train'}",
        f"paths.results={root / 'results'}",
        "dataset.num_classes=3",
        "dataset.shards.images_per_shard=4",
        "dataset.shards.workers=1",
    ]
    proc = subprocess.run([*CLI, "prepare-shards", *overrides], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return overrides


def _opened_below(pids: list[int], folder: Path) -> set[str]:
    """Names of files below `folder` that `pids` hold open or mapped (/proc/PID/fd and /proc/PID/maps)."""
    found = set()
    prefix = str(folder) + os.sep
    for pid in pids:
        try:
            targets = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            targets += [line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()]
        except OSError:  # the process ended while being read
            continue
        found |= {target.removeprefix(prefix) for target in targets if target.startswith(prefix)}
    return found


@pytest.mark.parametrize(("loader", "given"), [("dali", True), ("torchvision", False)])
def test_train_reads_the_prepared_shards_with_each_loader(
    dataset: list[str], loader: str, given: bool, tmp_path: Path
) -> None:
    """The ranks read the shards --shards names (the workflow's way; the configured results folder then holds
    none), else those `prepare-shards` wrote for the configured dataset."""
    shards = output_dir(load(dataset))
    listed = {shard["name"] for shard in read_manifest(shards)["shards"]}
    out = tmp_path / "run"
    where = ["--shards", str(shards), f"paths.results={tmp_path / 'elsewhere'}"] if given else []
    if given:  # the results folder moves away from the shards: each key is given once
        dataset = [o for o in dataset if not o.startswith("paths.results=")]
    proc = subprocess.Popen(
        [*CLI, "train", "--out", str(out), *TRAIN, f"train.loader={loader}", *dataset, *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    opened: set[str] = set()
    deadline = time.monotonic() + 500
    while proc.poll() is None:  # the ranks and their loader workers hold the shard files while they train
        assert time.monotonic() < deadline, "the training run did not finish"
        opened |= _opened_below(descendants(proc.pid), shards)
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert metrics["loader"] == loader and metrics["workers"] == 2 and metrics["images_per_step"] == 4
    assert metrics["gb_per_step"]["total"] == pytest.approx(metrics["analytic_gb_per_step"]["total"], rel=1e-9)
    # The ranks read the shards themselves: rank 0 reads samples 0-5 (shards 0 and 1), rank 1 samples
    # 6-11 (shards 1 and 2), so together they held every tar of the manifest open.
    assert {name for name in opened if name.endswith(".tar")} == listed, (opened, listed)
