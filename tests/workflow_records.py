"""Run records in the train stage's metrics.json format, and plans in the plan stage's, for aggregate tests."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ralp_pipe.engine.topology import topology

# images/sec of each strategy per (model, gpus): the ps baseline is slowest, as in the paper.
THROUGHPUT = {"ps": 100.0, "allreduce": 150.0, "ralp_h": 180.0, "ralp_n": 240.0}


def metrics(model: str, dataset: str, strategy: str, gpus: int, network: str = "1gbit") -> dict:
    """A metrics.json document of one run."""
    topo = topology(strategy, gpus)
    volume = {"gradients": 0.4, "parameters": 0.4, "activations": 0.01, "activation_gradients": 0.01}
    if strategy.startswith("ralp"):
        volume = {"gradients": 0.02, "parameters": 0.02, "activations": 0.01, "activation_gradients": 0.01}
    volume["total"] = sum(volume.values())
    ips = THROUGHPUT[strategy] * gpus / 2
    return {
        "model": model, "dataset": dataset, "num_classes": 1000, "strategy": strategy, "gpus": gpus,
        "workers": topo.num_workers, "num_ps": len(topo.ps), "split": 8 if strategy.startswith("ralp") else None,
        "network": network, "rate": network, "batch_size": 2, "global_batch": 2 * topo.num_workers,
        "image_size": 32, "warmup_steps": 1, "measure_steps": 2, "images_per_sec": ips,
        "images_per_step": 2 * topo.num_workers, "step_time_s": 2 * topo.num_workers / ips,
        "gb_per_step": volume, "analytic_gb_per_step": volume,
        "wire_gb_per_step": None if network == "loopback" else 1.02 * volume["total"],  # train writes the total
        "hardware": {"cpu": "test", "cpus": 2}, "versions": {"torch": "x"}, "git_revision": "abc",
        "config_hash": "0123456789ab", "config": {"model": {"name": model}},
    }


def write_results(root: Path, models=("vgg11", "resnet18"), strategies=tuple(THROUGHPUT), gpus=(2, 4)) -> list[Path]:
    """Write run folders (metrics.json, steps.parquet) and plans below `root`; returns the run folders."""
    runs = []
    for model in models:
        for n in gpus:
            plan = {"strategies": {s: {"predicted_images_per_sec": THROUGHPUT[s] * n / 2 * 1.1,
                                       "predicted_gb_per_step": {"gradients": 0.25, "total": 0.5}, "split": 8, "pays": True} for s in strategies}}
            plan_path = root / "plans" / "synthetic1k" / model / f"n{n}-1gbit.json"
            plan_path.parent.mkdir(parents=True, exist_ok=True)
            plan_path.write_text(json.dumps(plan))
            for strategy in strategies:
                run = root / "runs" / "synthetic1k" / model / f"n{n}-1gbit" / strategy
                run.mkdir(parents=True, exist_ok=True)
                (run / "metrics.json").write_text(json.dumps(metrics(model, "synthetic1k", strategy, n)))
                pd.DataFrame({"step": [0, 1], "step_time_s": [0.1, 0.1]}).to_parquet(run / "steps.parquet")
                runs.append(run)
    return runs


def write_concurrent(root: Path, name: str = "w0") -> Path:
    """A concurrent.json of two ps jobs sharing one link, in the concurrent stage's format."""
    doc = {"network": {"rate": "1gbit", "burst": "1mb"}, "shared_host": 0, "jobs": [
        {"job": i, "overrides": ["strategy=ps", f"model={m}"], "hosts": [1, 2, 0],
         "alone_images_per_sec": 100.0, "together_images_per_sec": 50.0 + 10 * i, "slowdown": 100.0 / (50.0 + 10 * i)}
        for i, m in enumerate(("vgg11", "resnet18"))]}
    path = root / "concurrent" / name / "concurrent.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path
