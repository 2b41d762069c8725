"""`ralp-pipe train --out DIR <overrides>`: one distributed training measurement.

The command (the *driver*) checks the prepared shards a shard loader will read, resolves the
config, the split point and the analytic bytes per step (from placement units on the meta
device, so no parameters are allocated), starts the
ranks of :mod:`ralp_pipe.engine.rank` (``cluster.kind``: local subprocesses, emulated-network
hosts, or srun tasks) and, once every rank succeeded, writes DIR/steps.parquet and the
:class:`~ralp_pipe.results.records.RunMetrics` record DIR/metrics.json atomically (file names
from :mod:`ralp_pipe.results.layout`). On any failure nothing is written and the command
raises :class:`~ralp_pipe.errors.RunFailure` naming the failing rank. Under ``srun`` with one
task per rank the command is itself a rank and rank 0 writes the files. Before the ranks start,
the driver prints where rank 0's log is: rank 0 logs its progress there while it trains.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ralp_pipe.atomic import atomic_path, write_json_atomic
from ralp_pipe.config import Config, cluster_kind, digest, load, to_dict
from ralp_pipe.data.loaders import reads_shards, shard_files
from ralp_pipe.data.shards import output_dir
from ralp_pipe.engine import models, volume
from ralp_pipe.engine.metrics import summarize
from ralp_pipe.engine.rank import BACKEND_ENV, DEVICE_ENV, RankResult, rank_command, run_rank
from ralp_pipe.engine.topology import Topology, of_strategy
from ralp_pipe.errors import ConfigError, DataError, RunFailure
from ralp_pipe.results.layout import METRICS_FILE, STEPS_FILE
from ralp_pipe.results.records import Plan, RunMetrics
from ralp_pipe.runtime import devices, hardware
from ralp_pipe.runtime.launch import RankEnv, in_slurm_step, launch_local, launch_slurm, rank_log, srun_log
from ralp_pipe.runtime.nodes import node_of_ranks

STAGING_INFIX = ".ranks-"  # a run's staging folder (rank logs, rank 0's result) is .NAME.ranks-<random> next to --out
DRIVER_FILE = "driver.json"  # in the staging folder: host, PID and start time of the driver that owns it
UNCLAIMED_STALE_S = 60.0  # a staging folder without DRIVER_FILE (written right after it is made) is stale after this
PREVIOUS_FOLDER = ".previous"  # in --out: an earlier run's records, set aside while a rerun runs
MIN_FREE_BYTES = 16 * 2**20  # free space a run needs at least, for its records, rank logs and temporary copies
ROW_BYTES = 1024  # one step record as JSON in the rank result, in steps.parquet and in their temporary copies
FULL_BYTES = 2**20  # a filesystem with less free space is full for the ranks' logs
RANK_BASE_BYTES = 500_000_000  # memory of one rank before its model: interpreter, torch, gloo buffers
PARAMETER_COPIES = 3  # a rank holds parameters, their gradients and momentum (or the buffers in flight)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe train`."""
    parser.add_argument("--out", required=True, type=Path, help=f"run folder for {METRICS_FILE} and {STEPS_FILE}")


def main(args: argparse.Namespace) -> int:
    """Run one training measurement and report its throughput."""
    metrics = run(load(args.overrides), args.out)
    if metrics is not None:
        print(
            f"{metrics.strategy} {metrics.model} N={metrics.gpus}: {metrics.images_per_sec:.2f} images/s, "
            f"{metrics.gb_per_step['total']:.4f} GB/step -> {args.out}"
        )
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
        raise DataError(
            f"plan {path} has no integer strategies.{strategy}.split (found {split!r}): "
            f"regenerate it with `ralp-pipe plan`"
        )
    return split


def meta_units(cfg: Config) -> list[models.Unit]:
    """The model's placement units on the meta device: shapes and parameter counts only, no memory, no initialisation."""
    return models.model_units(cfg.model.name, cfg.dataset.num_classes, cfg.model.dropout, "meta")


def split_and_bytes(
    cfg: Config, topo: Topology, units: list[models.Unit] | None = None
) -> tuple[int | None, dict[str, int]]:
    """The run's split point and analytic bytes per step, from placement units on the meta device (`units` if given)."""
    t = cfg.train
    units = meta_units(cfg) if units is None else units
    with torch.device("meta"):  # the activation shapes too
        split = resolve_split(cfg, units)
        return split, volume.step_bytes(topo.strategy, units, split, topo, t.batch_size, t.image_size)


def build_metrics(
    cfg: Config, topo: Topology, split: int | None, analytic: dict[str, int], result: RankResult
) -> RunMetrics:
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
        hosts=result["hosts"],
        peak_rss_mb=result["peak_rss_mb"],
        device=result["device"],
        backend=result["backend"],
        loader=t.loader,
        # the ranks' threads and allocator, not this driver's
        hardware={
            **hardware.describe(),
            "torch_threads": min(result["threads"]),
            "malloc_keeps_freed": all(result["keeps_freed"]),
        },
        versions=hardware.versions(),
        git_revision=hardware.git_revision(),
        config_hash=digest(config),
        config=config,
    )


def os_problem(exc: OSError, path: Path | None = None) -> str:
    """`path: strerror (ERRNO)` of an OSError for one-line messages; `path` where the error names no file."""
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else type(exc).__name__
    return f"{exc.filename or path or '?'}: {exc.strerror or exc} ({name})"


def write_run(out: Path, metrics: RunMetrics, rows: list[dict[str, Any]]) -> None:
    """Write steps.parquet, then metrics.json (the completion marker), each atomically; all or nothing."""
    frame = pd.DataFrame(rows).sort_values(["rank", "step"], kind="stable")
    created = not out.exists()
    writing = out / STEPS_FILE
    try:
        with atomic_path(writing) as tmp:
            tmp.write_bytes(frame.to_parquet(index=False))  # Python's I/O gives the errno if it fails
        writing = out / METRICS_FILE
        metrics.write(writing)
    except OSError as exc:
        with contextlib.suppress(OSError):  # steps without metrics.json would be a record of nothing
            (out / STEPS_FILE).unlink(missing_ok=True)
            if created:
                out.rmdir()
        raise RunFailure(
            f"cannot write the run's records to {out}: {os_problem(exc, writing)}; the measurement is lost: "
            f"free space there (or choose another --out) and rerun"
        ) from exc


def _finish(
    cfg: Config, topo: Topology, out: Path, split: int | None, analytic: dict[str, int], result: RankResult
) -> RunMetrics:
    metrics = build_metrics(cfg, topo, split, analytic, result)
    write_run(out, metrics, result["rows"])
    return metrics


def check_host(cfg: Config, topo: Topology, units: list[models.Unit]) -> None:
    """Refuse more ranks than this host's cores and memory can run, when every rank runs here."""
    cores, memory = hardware.usable_cores(), hardware.usable_memory_bytes()
    parameters = sum(p.numel() * p.element_size() for u in units for p in u.module.parameters())
    per_rank = RANK_BASE_BYTES + PARAMETER_COPIES * parameters
    by_cores, by_memory = max(8, 4 * cores), memory // per_rank
    if topo.world_size <= min(by_cores, by_memory):
        return
    raise ConfigError(
        f"cluster.gpus={cfg.cluster.gpus} makes {topo.strategy} start {topo.world_size} ranks on this host "
        f"(cluster.kind={cfg.cluster.kind}), which has {cores} CPU cores and {memory / 1e9:.1f} GB of memory: "
        f"at most {min(by_cores, by_memory)} ranks fit (max(8, 4 x {cores} cores) = {by_cores}; "
        f"{memory / 1e9:.1f} GB / {per_rank / 1e9:.2f} GB a rank = {by_memory}, a rank taking "
        f"{RANK_BASE_BYTES / 1e9:.1f} GB + {PARAMETER_COPIES} x {parameters / 1e9:.2f} GB of {cfg.model.name} "
        f"parameters): use fewer cluster.gpus, or cluster=slurm to spread the ranks over nodes"
    )


def record_bytes(cfg: Config, topo: Topology) -> int:
    """Free space the run needs next to and in --out: its step records (in several copies), logs and metrics."""
    rows = topo.world_size * (cfg.train.warmup_steps + cfg.train.measure_steps)
    return max(MIN_FREE_BYTES, rows * ROW_BYTES + FULL_BYTES)


def _process_start(pid: int) -> str | None:
    """Start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _is_stale(staging: Path) -> bool:
    """True when the driver that made `staging` is gone (a folder no driver claimed counts after a minute)."""
    try:
        owner = json.loads((staging / DRIVER_FILE).read_text())
        host, pid, started = owner["host"], int(owner["pid"]), owner["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return time.time() - staging.lstat().st_mtime > UNCLAIMED_STALE_S
    return host == socket.gethostname() and _process_start(pid) != started


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders of earlier drivers of `out` that were killed (`.NAME.ranks-*` next to it)."""
    for staging in out.parent.glob(f".{out.name}{STAGING_INFIX}*"):
        if staging.is_dir() and not staging.is_symlink() and _is_stale(staging):
            shutil.rmtree(staging, ignore_errors=True)
            print(f"ralp-pipe train: removed {staging}, left by a driver that was killed")


def _refuse_out(out: Path, problem: str) -> ConfigError:
    return ConfigError(f"--out {out}: {problem}; choose another --out or fix that path")


def make_staging(out: Path, needed: int) -> Path:
    """Check --out before any rank starts and make this run's staging folder next to it, claimed by this driver.

    --out must be a folder (or not exist yet), it and its parent writable, with `needed` bytes free.
    """
    if out.exists() and not out.is_dir():
        raise _refuse_out(out, "is a file, not a folder (the run writes metrics.json and steps.parquet into it)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(out)
        for folder in dict.fromkeys(p for p in (out.parent, out) if p.is_dir()):
            free = shutil.disk_usage(folder).free
            if free < needed:
                raise _refuse_out(
                    out,
                    f"{folder}: {os.strerror(errno.ENOSPC)} (ENOSPC): {free / 1e6:.1f} MB free, "
                    f"the run's records and logs need {needed / 1e6:.0f} MB",
                )
        if out.is_dir():
            fd, probe = tempfile.mkstemp(prefix=f".{out.name}.probe-", dir=out)
            os.close(fd)
            os.unlink(probe)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING_INFIX}", dir=out.parent))
    except OSError as exc:
        if isinstance(exc, FileExistsError | NotADirectoryError):  # a file where a folder of the path should be
            raise _refuse_out(out, f"{os_problem(exc)}: a file stands where a folder of the path should be") from exc
        raise _refuse_out(out, f"cannot write there: {os_problem(exc)}") from exc
    try:
        write_json_atomic(
            staging / DRIVER_FILE,
            {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())},
        )
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _refuse_out(out, f"cannot write there: {os_problem(exc)}") from exc
    return staging


def set_aside_previous(out: Path) -> None:
    """Move an earlier run's records into `out/.previous/` (as NAME.old) so that a failed rerun leaves none current."""
    found = [name for name in (METRICS_FILE, STEPS_FILE) if (out / name).exists()]  # the completion marker first
    if not found:
        return
    previous = out / PREVIOUS_FOLDER
    try:
        previous.mkdir(exist_ok=True)
        for name in found:
            os.replace(out / name, previous / f"{name}.old")
    except OSError as exc:
        raise _refuse_out(out, f"cannot move the previous run's records aside: {os_problem(exc)}") from exc
    print(
        f"ralp-pipe train: moved the previous run's {' and '.join(found)} to {previous}/ as *.old "
        f"(removed once this run succeeds)"
    )


def _launch(
    cfg: Config, topo: Topology, staging: Path, split: int | None, device_type: str, backend: str
) -> RankResult:
    """Start and supervise the ranks; return rank 0's result. A full disk under the ranks' logs is named."""
    launcher = cluster_kind(cfg.cluster.kind).launcher
    result_file = staging / "result.json"
    entry = rank_command(result_file, cfg, split)
    env = {BACKEND_ENV: backend, DEVICE_ENV: device_type}
    timeout = cfg.cluster.init_timeout_s + cfg.cluster.timeout_s
    progress = srun_log(staging) if launcher == "srun" else rank_log(staging, 0)
    print(
        f"ralp-pipe train: {topo.world_size} rank{'s' * (topo.world_size > 1)} of {topo.strategy} {cfg.model.name} N={topo.gpus}; "
        f"rank 0 logs its progress to {progress} until the run ends",
        flush=True,
    )
    try:
        if launcher == "srun":
            os.environ.update(env)
            gpus_per_task = 1 if cfg.cluster.slurm.gpus_per_node > 0 else 0
            nodes = node_of_ranks(topo, cfg.cluster.slurm.gpus_per_node)
            launch_slurm(entry, nodes, timeout, staging, gpus_per_task, cfg.network.interface)
        elif launcher == "emulated":
            from ralp_pipe.runtime.emulated import emulated_sites

            with emulated_sites(topo.hosts, cfg.network.rate, cfg.network.burst) as emulated:
                launch_local(entry, topo.world_size, timeout, staging, emulated, env)
        else:
            launch_local(entry, topo.world_size, timeout, staging, None, env)
    except RunFailure as exc:
        if shutil.disk_usage(staging).free >= FULL_BYTES:
            raise
        raise RunFailure(
            f"{staging}: {os.strerror(errno.ENOSPC)} (ENOSPC): the disk holding the rank logs filled up "
            f"during the run, so the ranks' own errors may be missing; free space there and rerun. "
            f"{exc}"
        ) from exc
    result: RankResult = json.loads(result_file.read_text())
    return result


def run(cfg: Config, out: Path) -> RunMetrics | None:
    """Run the configured measurement and write its files to `out`; return the record (None on non-zero srun ranks)."""
    topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
    if reads_shards(cfg.train.loader):  # missing or unfit shards are refused before any rank starts
        shard_files(output_dir(cfg), cfg.dataset.num_classes)
    units = meta_units(cfg)
    split, analytic = split_and_bytes(cfg, topo, units)
    device_type, backend = devices.resolve(cfg.cluster, topo.world_size)
    kind = cluster_kind(cfg.cluster.kind)
    if kind.launcher == "srun" and in_slurm_step(topo.world_size):
        result = run_rank(cfg, RankEnv.from_environ(), device_type, backend, split)
        return None if result is None else _finish(cfg, topo, out, split, analytic, result)
    if kind.shares_host_cpus:
        check_host(cfg, topo, units)
    staging = make_staging(out, record_bytes(cfg, topo))
    try:
        set_aside_previous(out)
        metrics = _finish(cfg, topo, out, split, analytic, _launch(cfg, topo, staging, split, device_type, backend))
        shutil.rmtree(out / PREVIOUS_FOLDER, ignore_errors=True)
        return metrics
    finally:
        shutil.rmtree(staging, ignore_errors=True)
