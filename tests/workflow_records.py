"""Run records in the train stage's metrics.json format, and plans in the plan stage's, for aggregate tests.

Every (model, network, N, strategy) gets its own throughput, volume and prediction error, so a join
that drops a key, or a median that is really a mean or a max, gives numbers the tests can tell apart.
The base figures stay those of vgg11 at N=2 on 1gbit: tests/test_bundle.py edits its ralp_n record's
`"images_per_sec": 240.0`.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ralp_pipe.contract.layout import arm
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine.volume import CATEGORIES

# images/sec of each strategy for vgg11 at N=2 on 1gbit: the ps baseline is slowest, as in the paper.
THROUGHPUT = {"ps": 100.0, "allreduce": 150.0, "ralp_h": 180.0, "ralp_n": 240.0}
PAPER_FOUR = tuple(THROUGHPUT)  # the strategies write_results writes unless told
THROUGHPUT["dtf"] = 120.0  # Distributed TensorFlow's PS tasks, where a test asks for them
THROUGHPUT["byteps"] = 140.0  # a PS on every worker host, where a test asks for it
# What the network leaves of each strategy's throughput: ps suffers most on a slow link.
NETWORK_FACTOR = {
    "1gbit": dict.fromkeys(THROUGHPUT, 1.0),
    "100mbit": {"ps": 0.3, "allreduce": 0.45, "ralp_h": 0.8, "ralp_n": 0.9, "dtf": 0.4, "byteps": 0.5},
}
MODEL_OFFSET = {"vgg11": 0.0, "resnet18": 35.0}  # images/sec added to every strategy of a model
GPUS_OFFSET = 7.0  # images/sec added per GPU beyond 2
MODEL_VOLUME = {"vgg11": 1.0, "resnet18": 0.25}  # GB/step of a model against vgg11's
# Relative prediction error (predicted - measured) / measured: a per-strategy part plus model, network and N parts.
STRATEGY_ERROR = {"ps": 0.1, "allreduce": -0.04, "ralp_h": 0.25, "ralp_n": 0.02, "dtf": 0.05, "byteps": -0.02}
MODEL_ERROR = {"vgg11": 0.0, "resnet18": 0.03}
NETWORK_ERROR = {"1gbit": 0.0, "100mbit": -0.07}
GPUS_ERROR = 0.005  # per GPU beyond 2


def images_per_sec(model: str, network: str, strategy: str, gpus: int) -> float:
    """Measured images/sec of one run."""
    base = THROUGHPUT[strategy] * gpus / 2 * NETWORK_FACTOR[network][strategy]
    return base + MODEL_OFFSET[model] + GPUS_OFFSET * (gpus - 2)


def gb_per_step(model: str, strategy: str, gpus: int) -> dict[str, float]:
    """Measured (and analytic) GB/step of one run by category and in total."""
    volume = {"gradients": 0.4, "parameters": 0.4, "activations": 0.01, "activation_gradients": 0.01}
    if strategy.startswith("ralp"):
        volume = {"gradients": 0.02, "parameters": 0.02, "activations": 0.01, "activation_gradients": 0.01}
    scale = MODEL_VOLUME[model] * gpus / 2
    volume = {name: value * scale for name, value in volume.items()}
    volume["labels"] = 0.0  # as train records every category the comm layer counts
    volume["total"] = sum(volume.values())
    return volume


def prediction_error(model: str, network: str, strategy: str, gpus: int) -> float:
    """Relative error of the plan's images/sec prediction for one run."""
    return STRATEGY_ERROR[strategy] + MODEL_ERROR[model] + NETWORK_ERROR[network] + GPUS_ERROR * (gpus - 2)


# Repeat r of a configuration measures images_per_sec x REPEAT_FACTOR[r % 3]: mean 1, sample std 0.05.
REPEAT_FACTOR = (1.0, 0.95, 1.05)
MEASURE_STEPS = 3  # as many as steps() records


def metrics(
    model: str, dataset: str, strategy: str, gpus: int, network: str = "1gbit", repeat: int = 0, overlap: bool = True
) -> dict[str, Any]:
    """A metrics.json document of one run (repeat `repeat`; `overlap`=False: the sequential ablation at half speed),
    its figures those train computes from the records steps() writes and the window they imply."""
    topo = topology(strategy, gpus)
    volume = gb_per_step(model, strategy, gpus)
    ips = images_per_sec(model, network, strategy, gpus) * REPEAT_FACTOR[repeat % 3] * (1.0 if overlap else 0.5)
    images_per_step = 2 * topo.num_workers
    window_s = images_per_step * MEASURE_STEPS / ips
    return {
        "model": model,
        "dataset": dataset,
        "num_classes": 1000,
        "strategy": strategy,
        "gpus": gpus,
        "workers": topo.num_workers,
        "num_ps": len(topo.ps),
        "split": 8 if strategy.startswith("ralp") else None,
        "network": network,
        "rate": "unlimited" if network == "loopback" else network,
        "batch_size": 2,
        "global_batch": images_per_step,
        "image_size": 32,
        "warmup_steps": 1,
        "measure_steps": MEASURE_STEPS,
        "images_per_sec": ips,
        "images_per_step": images_per_step,
        "step_time_s": window_s / MEASURE_STEPS,
        "window_s": window_s,
        "gb_per_step": volume,
        "analytic_gb_per_step": volume,
        "wire_gb_per_step": None if network == "loopback" else 1.02 * volume["total"],  # train writes the total
        "wire_per_host": None if network == "loopback" else {"h0": {"tx": 1.02 * volume["total"], "rx": 0.0}},
        "hardware": {"cpu": "test", "cpus": 2},
        "versions": {"torch": "x"},
        "git_revision": "abc",
        "config_hash": "0123456789ab",
        "world_size": topo.world_size,
        "device": "cpu",
        "backend": "gloo",
        "loader": "dali",
        "config": {
            "model": {"name": model},
            "strategy": {"overlap": overlap},
            "train": {"repeat": repeat},
            "cluster": {"kind": "emulated"},
        },
    }


def plan(
    model: str, network: str, strategies: Sequence[str], gpus: int, dataset: str = "synthetic1k"
) -> dict[str, Any]:
    """A plan document for (dataset, model, N, network) with each strategy's predicted images/sec and GB/step."""
    entries = {}
    for s in strategies:
        volume = gb_per_step(model, s, gpus)
        predicted = images_per_sec(model, network, s, gpus) * (1 + prediction_error(model, network, s, gpus))
        entries[s] = {
            "predicted_images_per_sec": predicted,
            "split": 8,
            "split_after_unit": "layer4.0",
            "pays": True,
            "predicted_gb_per_step": {"gradients": volume["gradients"], "total": volume["total"]},
        }
    return {
        "dataset": dataset,
        "model": model,
        "gpus": gpus,
        "network": network,
        "profile_kind": "measured",
        "profile_device": "cpu",
        "strategies": entries,
    }


def write_results(
    root: Path,
    models: Sequence[str] = ("vgg11", "resnet18"),
    strategies: Sequence[str] = PAPER_FOUR,
    gpus: Sequence[int] = (2, 4),
    networks: Sequence[str] = ("1gbit",),
    repeats: int = 1,
    sequential: Sequence[str] = (),
) -> list[Path]:
    """Write run folders (metrics.json, steps.parquet) and plans below `root`; returns the run folders.

    Every configuration gets `repeats` runs; the `sequential` strategies also a sequential ablation.
    """
    runs = []
    for model in models:
        for network in networks:
            for n in gpus:
                plan_path = root / "plans" / "synthetic1k" / model / f"n{n}-{network}.json"
                plan_path.parent.mkdir(parents=True, exist_ok=True)
                plan_path.write_text(json.dumps(plan(model, network, strategies, n)))
                arms = [(s, True) for s in strategies] + [(s, False) for s in sequential]
                for (strategy, overlap), repeat in itertools.product(arms, range(repeats)):
                    name = arm(strategy, overlap)
                    run = root / "runs" / "synthetic1k" / model / f"n{n}-{network}" / name / f"r{repeat}"
                    run.mkdir(parents=True, exist_ok=True)
                    doc = metrics(model, "synthetic1k", strategy, n, network, repeat, overlap)
                    (run / "metrics.json").write_text(json.dumps(doc))
                    steps(doc).to_parquet(run / "steps.parquet")
                    runs.append(run)
    return runs


# A measured step's time on each worker, as a multiple of the run's mean step time (the window / its steps):
# p50 is the slowest worker's time of the middle step, so taking rank 0 or the mean over workers gives others.
# Each rank's steps fit in the window, as in a real run, where it also holds the gaps between steps.
STEP_SHAPE = ((0.8, 1.0, 1.15), (0.9, 1.1, 0.95))  # worker k's 3 measured steps: STEP_SHAPE[k % 2]
SERVER_STEP = 0.95  # every measured step of a server rank (ps or the PS device)
STEP_PARTS = {"compute_s": 0.4, "comm_wait_s": 0.5, "data_wait_s": 0.1}  # shares of every step's time


def steps(doc: dict[str, Any]) -> pd.DataFrame:
    """steps.parquet of the run `doc` records, a row per rank of its topology and step: one warm-up step of rank 0
    (slow, to be ignored) and three measured steps; rank 0 sends the run's GB/step in every measured step."""
    step_time_s = doc["step_time_s"]
    rows = [dict(rank=0, role="worker", step=0, phase="warmup", step_time_s=10 * step_time_s)]
    for rank, role in enumerate(topology(doc["strategy"], doc["gpus"]).roles):
        shape = STEP_SHAPE[rank % len(STEP_SHAPE)] if role == "worker" else (SERVER_STEP,) * 3
        rows += [
            dict(rank=rank, role=role, step=i + 1, phase="measure", step_time_s=f * step_time_s)
            for i, f in enumerate(shape)
        ]
    frame = pd.DataFrame(rows)
    for part, share in STEP_PARTS.items():
        frame[part] = share * frame["step_time_s"]
    frame.loc[frame["role"] != "worker", "data_wait_s"] = 0.0  # a server reads no batches
    frame["compute_s"] = frame["step_time_s"] - frame["comm_wait_s"] - frame["data_wait_s"]  # what the waits leave
    sends = (frame["rank"] == 0) & (frame["phase"] == "measure")
    for name in CATEGORIES:
        frame[f"bytes_{name}"] = sends * round(doc["gb_per_step"][name] * 1e9)
    return frame


DILATION = {"mode": "real", "target_device": "v100", "target_link_rate": "1gbit", "shaped_link_rate": "125000000bit"}


def dilate(run: Path, factor: float, overruns: int) -> None:
    """Make a fabricated run a dilated one: its record and `overruns` in its first measured step."""
    doc = json.loads((run / "metrics.json").read_text())
    doc["target_images_per_sec"] = doc["images_per_sec"] * factor
    doc["dilation"] = dict(DILATION, factor=factor, overruns=overruns)
    (run / "metrics.json").write_text(json.dumps(doc))
    steps = pd.read_parquet(run / "steps.parquet")
    steps["overruns"] = 0
    steps.loc[steps.index[steps["phase"] == "measure"][0], "overruns"] = overruns
    steps.to_parquet(run / "steps.parquet")


def write_concurrent(root: Path, name: str = "w0", factor: float | None = None) -> Path:
    """A concurrent.json of two ps jobs sharing one link, in the concurrent stage's format (time-dilated by `factor`:
    the images/sec are the emulator's)."""
    doc = {
        "network": {"rate": "1gbit", "burst": "1mb"},
        "shared_host": 0,
        "jobs": [
            {
                "job": i,
                "overrides": ["strategy=ps", f"model={m}"],
                "hosts": [1, 2, 0],
                "alone_images_per_sec": 100.0,
                "together_images_per_sec": 50.0 + 10 * i,
                "slowdown": 100.0 / (50.0 + 10 * i),
                "dilation_factor": factor,
            }
            for i, m in enumerate(("vgg11", "resnet18"))
        ],
    }
    path = root / "concurrent" / name / "concurrent.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def write_aggregated(root: Path, **results: Any) -> Path:
    """`write_results(root, **results)`, a resolved config and a workload, aggregated through the CLI."""
    from ralp_pipe.cli import main as cli

    write_results(root, **results)
    (root / "configs").mkdir()
    (root / "configs" / "smoke.json").write_text('{"settings": {}}\n')
    concurrent = write_concurrent(root)
    argv = [
        "aggregate",
        "--runs",
        str(root / "runs"),
        "--plans",
        str(root / "plans"),
        "--concurrent",
        str(concurrent),
        "--out",
        str(root / "tables"),
    ]
    assert cli(argv) == 0
    return root
