"""`ralp-pipe train --out DIR <overrides>`: one distributed training measurement.

The command (the *driver*) resolves the config, the split point and the analytic bytes per
step (from placement units on the meta device, so no parameters are allocated), starts the
ranks of :mod:`ralp_pipe.engine.rank` (``cluster.kind``: local subprocesses, emulated-network
hosts, or srun tasks) and, once every rank succeeded, writes DIR/steps.parquet and the
:class:`~ralp_pipe.results.records.RunMetrics` record DIR/metrics.json atomically (file names
from :mod:`ralp_pipe.results.layout`). On any failure nothing is written and the command
raises :class:`~ralp_pipe.errors.RunFailure` naming the failing rank. Under ``srun`` with one
task per rank the command is itself a rank and rank 0 writes the files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ralp_pipe.atomic import atomic_path
from ralp_pipe.config import Config, cluster_kind, digest, load, to_dict
from ralp_pipe.engine import models, volume
from ralp_pipe.engine.metrics import summarize
from ralp_pipe.engine.rank import BACKEND_ENV, DEVICE_ENV, RankResult, rank_command, run_rank
from ralp_pipe.engine.topology import Topology, topology
from ralp_pipe.errors import DataError
from ralp_pipe.results.layout import METRICS_FILE, STEPS_FILE
from ralp_pipe.results.records import Plan, RunMetrics
from ralp_pipe.runtime import devices, hardware
from ralp_pipe.runtime.launch import RankEnv, in_slurm_step, launch_local, launch_slurm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe train`."""
    parser.add_argument("--out", required=True, type=Path, help=f"run folder for {METRICS_FILE} and {STEPS_FILE}")


def main(args: argparse.Namespace) -> int:
    """Run one training measurement and report its throughput."""
    metrics = run(load(args.overrides), args.out)
    if metrics is not None:
        print(f"{metrics.strategy} {metrics.model} N={metrics.gpus}: {metrics.images_per_sec:.2f} images/s, "
              f"{metrics.gb_per_step['total']:.4f} GB/step -> {args.out}")
    return 0


def resolve_split(cfg: Config, units: list[models.Unit]) -> int | None:
    """RALP split point: `strategy.split`, else the plan file's, else the default; None for ps/allreduce."""
    name = cfg.strategy.name
    if name in ("ps", "allreduce"):
        return None
    if cfg.strategy.split is not None:
        split, source = cfg.strategy.split, "strategy.split"
    elif cfg.strategy.plan:
        split, source = _plan_split(Path(cfg.strategy.plan), name), f"plan {cfg.strategy.plan}"
    else:
        return models.default_split(units)
    return models.check_split(split, len(units), f"{source}, model {cfg.model.name}")


def _plan_split(path: Path, strategy: str) -> int:
    entry = Plan.read(path).strategies.get(strategy)
    split = entry.get("split") if isinstance(entry, dict) else None
    if not isinstance(split, int) or isinstance(split, bool):
        raise DataError(f"plan {path} has no integer strategies.{strategy}.split (found {split!r}): "
                        f"regenerate it with `ralp-pipe plan`")
    return split


def split_and_bytes(cfg: Config, topo: Topology) -> tuple[int | None, dict[str, int]]:
    """The run's split point and analytic bytes per step, from placement units on the meta device."""
    t = cfg.train
    with torch.device("meta"):  # shapes and parameter counts only: no parameter memory, no initialisation
        units = models.placement_units(models.build(cfg.model.name, cfg.dataset.num_classes, cfg.model.dropout))
        split = resolve_split(cfg, units)
        return split, volume.step_bytes(topo.strategy, units, split, topo, t.batch_size, t.image_size)


def build_metrics(cfg: Config, topo: Topology, split: int | None, analytic: dict[str, int],
                  result: RankResult) -> RunMetrics:
    """The run's record from the driver's split and analytic bytes and rank 0's result."""
    t = cfg.train
    figures = summarize(result["rows"], result["window_s"], topo.num_workers, t.batch_size, t.measure_steps)
    wire = result["wire"]
    config = to_dict(cfg)
    return RunMetrics(
        model=cfg.model.name,
        dataset=cfg.dataset.name,
        num_classes=cfg.dataset.num_classes,
        strategy=topo.strategy,
        gpus=topo.gpus,
        workers=topo.num_workers,
        num_ps=len(topo.ps),
        split=split,
        network=cfg.network.name,
        rate=cfg.network.rate,
        batch_size=t.batch_size,
        global_batch=t.batch_size * topo.num_workers,
        image_size=t.image_size,
        warmup_steps=t.warmup_steps,
        measure_steps=t.measure_steps,
        images_per_sec=figures.images_per_sec,
        images_per_step=figures.images_per_step,
        step_time_s=figures.step_time_s,
        window_s=result["window_s"],
        gb_per_step=figures.gb_per_step,
        analytic_gb_per_step={"total": analytic["total"] / 1e9, **{k: analytic[k] / 1e9 for k in volume.CATEGORIES}},
        wire_gb_per_step=None if wire is None else wire["total"],
        wire_per_host=None if wire is None else wire["per_host"],
        world_size=topo.world_size,
        roles=topo.roles,
        device=result["device"],
        backend=result["backend"],
        loader=t.loader,
        hardware=hardware.describe(),
        versions=hardware.versions(),
        git_revision=hardware.git_revision(),
        config_hash=digest(config),
        config=config,
    )


def write_run(out: Path, metrics: RunMetrics, rows: list[dict[str, Any]]) -> None:
    """Write steps.parquet, then metrics.json (the completion marker), each atomically."""
    frame = pd.DataFrame(rows).sort_values(["rank", "step"], kind="stable")
    with atomic_path(out / STEPS_FILE) as tmp:
        frame.to_parquet(tmp, index=False)
    metrics.write(out / METRICS_FILE)


def _finish(cfg: Config, topo: Topology, out: Path, split: int | None, analytic: dict[str, int],
            result: RankResult) -> RunMetrics:
    metrics = build_metrics(cfg, topo, split, analytic, result)
    write_run(out, metrics, result["rows"])
    return metrics


def run(cfg: Config, out: Path) -> RunMetrics | None:
    """Run the configured measurement and write its files to `out`; return the record (None on non-zero srun ranks)."""
    topo = topology(cfg.strategy.name, cfg.cluster.gpus, cfg.strategy.num_ps)
    split, analytic = split_and_bytes(cfg, topo)
    device_type, backend = devices.resolve(cfg.cluster, topo.world_size)
    launcher = cluster_kind(cfg.cluster.kind).launcher
    if launcher == "srun" and in_slurm_step(topo.world_size):
        result = run_rank(cfg, RankEnv.from_environ(), device_type, backend, split)
        return None if result is None else _finish(cfg, topo, out, split, analytic, result)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.ranks-", dir=out.parent))
    try:
        result_file = staging / "result.json"
        command = rank_command(result_file, cfg, split)
        env = {BACKEND_ENV: backend, DEVICE_ENV: device_type}
        timeout = cfg.cluster.init_timeout_s + cfg.cluster.timeout_s
        if launcher == "srun":
            os.environ.update(env)
            gpus_per_task = 1 if cfg.cluster.slurm.gpus_per_node > 0 else 0
            launch_slurm(command, topo.world_size, timeout, staging, gpus_per_task)
        elif launcher == "emulated":
            from ralp_pipe.runtime.emulated import rank_placement

            with rank_placement(topo.world_size, cfg.network.rate, cfg.network.burst) as emulated:
                launch_local(command, topo.world_size, timeout, staging, emulated, env)
        else:
            launch_local(command, topo.world_size, timeout, staging, None, env)
        result: RankResult = json.loads(result_file.read_text())
        return _finish(cfg, topo, out, split, analytic, result)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
