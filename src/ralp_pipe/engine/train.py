"""`ralp-pipe train --out DIR <overrides>`: one distributed training measurement.

The command (the *driver*) resolves the config, starts the ranks (``cluster.kind``: local
subprocesses, emulated-network hosts, or srun tasks) and, once every rank succeeded, writes
DIR/steps.parquet and DIR/metrics.json atomically. On any failure nothing is written and the
command exits non-zero with the failing rank named. Under ``srun`` with one task per rank the
command is itself a rank and rank 0 writes the files.

Each rank runs ``python -m ralp_pipe.engine.train --rank-result FILE CONFIG_JSON`` (rank identity
from the environment, see :class:`ralp_pipe.runtime.launch.RankEnv`).

Test hooks, read by the ranks: ``RALP_PIPE_FAIL_RANK=r`` and ``RALP_PIPE_FAIL_STEP=s`` make
rank r fail at step s; ``RALP_PIPE_FAIL_MODE`` is ``raise`` (default), ``kill`` (SIGKILL
itself) or ``hang`` (sleep until stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import torch
import torch.distributed as dist

from ralp_pipe.runtime import hardware

from ralp_pipe.engine import models, volume
from ralp_pipe.atomic import atomic_path, write_json_atomic
from ralp_pipe.engine.comm import Comm
from ralp_pipe.config import Config, ConfigError, cluster_kind, digest, from_dict, load, to_dict
from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime import devices
from ralp_pipe.runtime.launch import (
    Placement, RankEnv, in_slurm_step, init_group, launch_local, launch_slurm, python_module_command,
)
from ralp_pipe.engine.metrics import MEASURE, WARMUP, step_record, summarize, synchronize, window_edge
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.topology import Topology, topology

BACKEND_ENV, DEVICE_ENV = "RALP_PIPE_BACKEND", "RALP_PIPE_DEVICE"
FAIL_RANK, FAIL_STEP, FAIL_MODE = "RALP_PIPE_FAIL_RANK", "RALP_PIPE_FAIL_STEP", "RALP_PIPE_FAIL_MODE"
METRICS_FILE, STEPS_FILE = "metrics.json", "steps.parquet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe train`."""
    parser.add_argument("--out", required=True, type=Path, help="run folder for metrics.json and steps.parquet")


def main(args: argparse.Namespace) -> int:
    """Run one training measurement and report its throughput."""
    cfg = load(args.overrides)
    try:
        metrics = run(cfg, args.out)
    except RunFailure as exc:
        print(f"ralp-pipe train: {exc}", file=sys.stderr)
        return 1
    if metrics is not None:
        gb = metrics["gb_per_step"]["total"]
        print(f"{metrics['strategy']} {metrics['model']} N={metrics['gpus']}: "
              f"{metrics['images_per_sec']:.2f} images/s, {gb:.4f} GB/step -> {args.out}")
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
    try:
        plan = json.loads(path.read_text())
        return int(plan["strategies"][strategy]["split"])
    except OSError as exc:
        raise ConfigError(f"strategy.plan={str(path)!r} cannot be read ({exc}); run `ralp-pipe plan` first") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"strategy.plan={str(path)!r} has no integer strategies.{strategy}.split ({exc!r}); "
            f"regenerate it with `ralp-pipe plan`"
        ) from exc


def _units(cfg: Config) -> list[models.Unit]:
    torch.manual_seed(cfg.train.seed)
    return models.placement_units(models.build(cfg.model.name, cfg.dataset.num_classes, cfg.model.dropout))


def _batches(cfg: Config, topo: Topology, rank: int, device: torch.device) -> Iterator[Any] | None:
    if rank not in topo.workers:
        return None
    from ralp_pipe.data.loaders import make_loader

    loader = make_loader(
        cfg.train.loader, Path(cfg.paths.results) / "data" / cfg.dataset.name, cfg.train.batch_size,
        cfg.train.image_size, cfg.dataset.num_classes, rank=topo.workers.index(rank), world_size=topo.num_workers,
        threads=cfg.train.loader_threads, seed=cfg.train.seed, device=str(device),
    )
    return iter(loader)


def _maybe_fail(rank: int, step: int) -> None:
    """The failure test hook (see the module docstring)."""
    if os.environ.get(FAIL_RANK) != str(rank) or os.environ.get(FAIL_STEP) != str(step):
        return
    mode = os.environ.get(FAIL_MODE, "raise")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"rank {rank} fails at step {step} as asked by {FAIL_RANK}/{FAIL_STEP}")


def _wire_reading() -> Any:
    from ralp_pipe.runtime.emulated import host_counters

    return host_counters()


def run_rank(cfg: Config, env: RankEnv, device_type: str, backend: str) -> dict[str, Any] | None:
    """Train on this rank; rank 0 returns every rank's records and the window, the others None."""
    torch.set_num_threads(hardware.threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))))
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    init_group(env, backend, cfg.cluster.init_timeout_s, cfg.cluster.timeout_s)
    try:
        topo = topology(cfg.strategy.name, cfg.cluster.gpus, cfg.strategy.num_ps)
        if env.world_size != topo.world_size:
            raise RunFailure(f"{env.world_size} ranks started but {topo.strategy} with {topo.gpus} GPUs needs {topo.world_size}")
        units = _units(cfg)
        split = resolve_split(cfg, units)
        t = cfg.train
        comm = Comm(env.rank, env.world_size, backend)
        setup = StepSetup(topo, comm, units, split, Optim(t.lr, t.momentum, t.weight_decay), device,
                          t.batch_size, t.image_size, t.amp)
        strategy = build(setup)
        batches = _batches(cfg, topo, env.rank, device)
        role = topo.role(env.rank)
        rows, start, wire_start = [], window_edge(device), None
        for step in range(t.warmup_steps + t.measure_steps):
            if step == t.warmup_steps:
                start, wire_start = window_edge(device), _wire_reading()
            _maybe_fail(env.rank, step)
            began = time.perf_counter()
            strategy.step(next(batches) if batches is not None else None)
            synchronize(device)
            phase = WARMUP if step < t.warmup_steps else MEASURE
            rows.append(step_record(env.rank, role, step, phase, time.perf_counter() - began, comm.take()))
        end, wire_end = window_edge(device), _wire_reading()
        gathered: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object((rows, wire_start, wire_end), gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if gathered is None:
        return None
    return {
        "window_s": end - start,
        "split": split,
        "device": str(device),
        "backend": backend,
        "rows": [row for rank_rows, _, _ in gathered for row in rank_rows],
        "wire": _wire_gb([g[1] for g in gathered], [g[2] for g in gathered], t.measure_steps),
    }


def _wire_gb(start: list[Any], end: list[Any], steps: int) -> dict[str, Any] | None:
    """Per-host link counters over the window (emulated cluster only)."""
    if any(reading is None for reading in start + end):
        return None
    from ralp_pipe.runtime.emulated import wire_gb_per_step

    return wire_gb_per_step(start, end, steps)


def build_metrics(cfg: Config, topo: Topology, result: dict[str, Any]) -> dict[str, Any]:
    """metrics.json content from rank 0's result."""
    t = cfg.train
    figures = summarize(result["rows"], result["window_s"], topo.num_workers, t.batch_size, t.measure_steps)
    analytic = volume.step_bytes(topo.strategy, _units(cfg), result["split"], topo, t.batch_size, t.image_size)
    wire = result["wire"]
    config = to_dict(cfg)
    return {
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "num_classes": cfg.dataset.num_classes,
        "strategy": topo.strategy,
        "gpus": topo.gpus,
        "workers": topo.num_workers,
        "num_ps": len(topo.ps),
        "split": result["split"],
        "network": cfg.network.name,
        "rate": cfg.network.rate,
        "batch_size": t.batch_size,
        "global_batch": t.batch_size * topo.num_workers,
        "image_size": t.image_size,
        "warmup_steps": t.warmup_steps,
        "measure_steps": t.measure_steps,
        "images_per_sec": figures.images_per_sec,
        "images_per_step": figures.images_per_step,
        "step_time_s": figures.step_time_s,
        "window_s": result["window_s"],
        "gb_per_step": figures.gb_per_step,
        "analytic_gb_per_step": {"total": analytic["total"] / 1e9, **{k: analytic[k] / 1e9 for k in volume.CATEGORIES}},
        "wire_gb_per_step": None if wire is None else wire["total"],
        "wire_per_host": None if wire is None else wire["per_host"],
        "world_size": topo.world_size,
        "roles": topo.roles,
        "device": result["device"],
        "backend": result["backend"],
        "loader": t.loader,
        "hardware": hardware.describe(),
        "versions": hardware.versions(),
        "git_revision": hardware.git_revision(),
        "config_hash": digest(config),
        "config": config,
    }


def write_run(out: Path, metrics: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Write steps.parquet, then metrics.json (the completion marker), each atomically."""
    frame = pd.DataFrame(rows).sort_values(["rank", "step"], kind="stable")
    with atomic_path(out / STEPS_FILE) as tmp:
        frame.to_parquet(tmp, index=False)
    write_json_atomic(out / METRICS_FILE, metrics)


def _finish(cfg: Config, topo: Topology, out: Path, result: dict[str, Any],
            finish: Callable[[dict[str, Any]], dict[str, Any]] | None) -> dict[str, Any]:
    metrics = build_metrics(cfg, topo, result)
    if finish is not None:
        metrics = finish(metrics)
    write_run(out, metrics, result["rows"])
    return metrics


def run(cfg: Config, out: Path, placement: Placement | None = None,
        finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Run the configured measurement and write its files to `out`; return the metrics (None on non-zero srun ranks).

    `placement` overrides where local ranks start (see :class:`ralp_pipe.runtime.launch.RankPlacement`);
    `finish` may amend the metrics before they are written.
    """
    topo = topology(cfg.strategy.name, cfg.cluster.gpus, cfg.strategy.num_ps)
    resolve_split(cfg, _units(cfg))
    device_type, backend = devices.resolve(cfg.cluster, topo.world_size)
    launcher = cluster_kind(cfg.cluster.kind).launcher
    if launcher == "srun" and in_slurm_step(topo.world_size):
        result = run_rank(cfg, RankEnv.from_environ(), device_type, backend)
        return None if result is None else _finish(cfg, topo, out, result, finish)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.ranks-", dir=out.parent))
    try:
        result_file = staging / "result.json"
        command = python_module_command(__name__, "--rank-result", str(result_file), json.dumps(to_dict(cfg)))
        env = {BACKEND_ENV: backend, DEVICE_ENV: device_type}
        timeout = cfg.cluster.init_timeout_s + cfg.cluster.timeout_s
        if launcher == "srun":
            os.environ.update(env)
            gpus_per_task = 1 if cfg.cluster.slurm.gpus_per_node > 0 else 0
            launch_slurm(command, topo.world_size, timeout, staging, gpus_per_task)
        elif launcher == "emulated" and placement is None:
            from ralp_pipe.runtime.emulated import rank_placement

            with rank_placement(topo.world_size, cfg.network.rate, cfg.network.burst) as emulated:
                launch_local(command, topo.world_size, timeout, staging, emulated, env)
        else:
            launch_local(command, topo.world_size, timeout, staging, placement, env)
        result = json.loads(result_file.read_text())
        return _finish(cfg, topo, out, result, finish)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _rank_main(argv: list[str]) -> int:
    """Entry point of one rank started by the driver."""
    parser = argparse.ArgumentParser(prog="python -m ralp_pipe.engine.train", description="one rank of a training run")
    parser.add_argument("--rank-result", required=True, type=Path, help="where rank 0 writes the gathered records")
    parser.add_argument("config", help="resolved configuration as JSON")
    args = parser.parse_args(argv)
    cfg = from_dict(json.loads(args.config))
    result = run_rank(cfg, RankEnv.from_environ(), os.environ[DEVICE_ENV], os.environ[BACKEND_ENV])
    if result is not None:
        write_json_atomic(args.rank_result, result)
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
