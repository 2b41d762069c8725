"""One rank of a training run: ``python -m ralp_pipe.engine.rank --rank-result FILE [--split K] [--shards DIR]
[--dilation JSON [--calibrate]] CONFIG``.

The driver (:mod:`ralp_pipe.engine.train`) resolves the split point, the padded times of a dilated
run (:class:`ralp_pipe.engine.dilation.Targets`) and the shards folder a shard loader reads (CONFIG
is the resolved configuration as JSON) and starts every rank with :func:`rank_command`; the rank
identity comes from the environment (see :class:`ralp_pipe.runtime.launch.RankEnv`), the device type
and backend from ``RALP_PIPE_DEVICE`` and ``RALP_PIPE_BACKEND``. Each rank builds the model with the configured
seed, trains `warmup_steps + measure_steps` steps and sends its step records to rank 0, which
writes the gathered :class:`RankResult` to FILE. With ``--calibrate`` (``dilation.factor=auto`` in real
mode) the ranks run undilated and only measure the smallest factor that would fit. Rank 0 prints its progress
(:class:`ralp_pipe.engine.metrics.Progress`) to its log while it trains.

Test hooks: ``RALP_PIPE_FAIL_RANK=r`` and ``RALP_PIPE_FAIL_STEP=s`` make rank r fail at step s;
``RALP_PIPE_FAIL_MODE`` is ``raise`` (default), ``kill`` (SIGKILL itself) or ``hang`` (sleep
until stopped).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence, TypedDict

import torch
import torch.distributed as dist

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import Config, from_dict, to_dict
from ralp_pipe.contract.topology import Topology, gpu_slots, of_strategy, placed
from ralp_pipe.engine import models
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.dilation import Pacer, Targets, compute_size, placeholder_batch, run_delay_s, stand_ins
from ralp_pipe.engine.gate import open_gate
from ralp_pipe.engine.metrics import MEASURE, WARMUP, Progress, StepTimes, step_record, synchronize, window_edge
from ralp_pipe.engine.strategies import Optim, StepSetup, build, holds_model
from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime import hardware
from ralp_pipe.runtime.launch import PythonMain, RankEnv, init_group
from ralp_pipe.runtime.process import exit_now
from ralp_pipe.runtime.wire import host_counters, wire_gb_per_step

BACKEND_ENV, DEVICE_ENV = "RALP_PIPE_BACKEND", "RALP_PIPE_DEVICE"
FAIL_RANK, FAIL_STEP, FAIL_MODE = "RALP_PIPE_FAIL_RANK", "RALP_PIPE_FAIL_STEP", "RALP_PIPE_FAIL_MODE"


class RankResult(TypedDict):
    """What rank 0 gathers from every rank: the measured window and all step records."""

    window_s: float
    device: str
    backend: str
    rows: list[dict[str, Any]]  # steps.parquet rows of every rank
    wire: dict[str, Any] | None  # per-host link counters over the window (emulated cluster, SLURM nodes)
    hosts: list[str]  # host name of every rank's machine or node
    threads: list[int]  # torch threads of every rank
    keeps_freed: list[bool]  # whether every rank's allocator reuses freed memory (hardware.keep_freed_memory)
    peak_rss_mb: list[float]  # peak resident memory of every rank's process
    needed_factor: list[float]  # dilated: the smallest factor every rank's units would have fitted (0: undilated)
    tail_steps: list[int]  # every rank's unmeasured steps after its window while its workload's other jobs measured
    # when rank 0 was running (forked, in its host's namespaces), had joined the group, had built its model and
    # strategy, reached the measured window's edges and had gathered every rank's records (seconds since the epoch)
    timeline: dict[str, float]


def rank_command(
    result_file: Path,
    cfg: Config,
    split: int | None,
    shards: Path | None,
    targets: Targets | None = None,
    calibrate: bool = False,
    hosts: Sequence[int] | None = None,
) -> PythonMain:
    """What every rank of `cfg`'s run runs: this module's :func:`main` with these arguments (`hosts`: each rank's
    host, where the driver laid them out on hosts of several ranks)."""
    split_args = () if split is None else ("--split", str(split))
    host_args = () if hosts is None else ("--hosts", json.dumps(list(hosts)))
    shard_args = () if shards is None else ("--shards", str(shards))
    dilation_args: tuple[str, ...] = () if targets is None else ("--dilation", json.dumps(targets.to_dict()))
    dilation_args += ("--calibrate",) if calibrate else ()
    return PythonMain(
        __name__,
        (
            "--rank-result",
            str(result_file),
            *split_args,
            *host_args,
            *shard_args,
            *dilation_args,
            json.dumps(to_dict(cfg)),
        ),
    )


def _batches(
    cfg: Config, topo: Topology, rank: int, device: torch.device, shards: Path | None, targets: Targets | None
) -> Iterator[Any] | None:
    """A worker's batches at the size it computes on (modelled: labels only); None on a server rank."""
    if rank not in topo.workers:
        return None
    if targets is not None and not targets.computes:
        return itertools.repeat(tuple(t.to(device) for t in placeholder_batch(cfg.train.batch_size)))
    from ralp_pipe.data.loaders import make_loader

    batch_size, image_size = compute_size(cfg)
    loader = make_loader(
        cfg.train.loader,
        shards,
        batch_size,
        image_size,
        cfg.dataset.num_classes,
        rank=topo.workers.index(rank),
        world_size=topo.num_workers,
        threads=cfg.train.loader_threads,
        seed=cfg.train.seed,
        device=str(device),
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


def _print_now(line: str) -> None:
    """A progress line in this rank's log, flushed at once so that `tail -f` shows it."""
    print(line, flush=True)


def _measured_edge(device: torch.device) -> tuple[float, Any]:
    """One edge of the measured window (:func:`window_edge`: every rank there, then the clock) and this host's link
    counters read there (None off emulated hosts and SLURM nodes, alike for every rank of a run). Where they are
    read, a second barrier keeps every rank from sending the next phase's bytes before every host has read its own:
    a rank reading late (a loaded machine) would otherwise take into its reading bytes sent after the edge, which
    the window then misses."""
    at = window_edge(device)
    reading = host_counters()
    if reading is not None:
        dist.barrier()
    return at, reading


def _wire_gb(start: list[Any], end: list[Any], steps: int) -> dict[str, Any] | None:
    """Per-host link counters over the window (emulated cluster only)."""
    if any(reading is None for reading in start + end):
        return None
    return wire_gb_per_step(start, end, steps)


def _units(cfg: Config, topo: Topology, rank: int, targets: Targets | None) -> list[models.Unit]:
    """This rank's placement units: the model (on the meta device for a rank that holds none), or its stand-ins
    where the run is modelled."""
    m, device = cfg.model, "cpu" if holds_model(topo, rank) else "meta"
    if targets is None or targets.computes:
        return models.model_units(m.name, cfg.dataset.num_classes, m.dropout, device)
    return stand_ins(
        models.model_units(m.name, cfg.dataset.num_classes, m.dropout, "meta"), cfg.train.image_size, device
    )


def _collect_between_steps() -> None:
    """Collect Python's garbage between steps only, never inside one: an automatic collection inside a step took
    1-4 ms here, which a dilated unit of tens of microseconds cannot absorb (it overran). What set-up made is
    frozen first, so the collection after each step scans only what steps made."""
    gc.collect()
    gc.freeze()
    gc.disable()


def gpu_index(env: RankEnv, topo: Topology, gpus_per_node: int) -> int:
    """The GPU this rank computes on: on a SLURM node (an srun task sees its node's GPUs) the one its placement gives
    it (:func:`gpu_slots`); on this machine one per local rank."""
    if env.node is None or env.rank >= topo.world_size:
        return env.local_rank % torch.cuda.device_count()
    return gpu_slots(topo, gpus_per_node)[env.rank]


def run_rank(
    cfg: Config,
    env: RankEnv,
    device_type: str,
    backend: str,
    split: int | None,
    shards: Path | None,
    targets: Targets | None = None,
    calibrate: bool = False,
    hosts: Sequence[int] | None = None,
) -> RankResult | None:
    """Train with the driver's `split` on batches from `shards` (None: no shard loader), padded to `targets`
    where dilated (`calibrate`: only measured against them); rank 0 returns every rank's records and the window,
    the others None."""
    timeline = {"rank_started": time.time()}
    keeps_freed = hardware.keep_freed_memory()
    sharing = cfg.train.cpu_share or int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    torch.set_num_threads(hardware.threads_per_rank(sharing))
    topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
    topo = topo if hosts is None else placed(topo, hosts)
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", gpu_index(env, topo, cfg.cluster.gpus_per_node))
        torch.cuda.set_device(device)
    init_group(env, backend, cfg.cluster.init_timeout_s, cfg.cluster.timeout_s)
    timeline["joined"] = time.time()
    try:
        if env.world_size != topo.world_size:
            raise RunFailure(
                f"{env.world_size} ranks started but {topo.strategy} with {topo.gpus} GPUs needs {topo.world_size}"
            )
        torch.manual_seed(cfg.train.seed)
        t = cfg.train
        comm = Comm(env.rank, env.world_size, backend)
        pacer = None
        if targets is not None:
            pacer = Pacer(
                targets,
                lambda: comm.wait_s,
                sync=lambda: synchronize(device),
                measure_only=calibrate,
                stalled=run_delay_s,
            )
        setup = StepSetup(
            topo,
            comm,
            _units(cfg, topo, env.rank, targets),
            split,
            Optim(t.lr, t.momentum, t.weight_decay),
            device,
            *compute_size(cfg),
            t.amp,
            cfg.strategy.overlap,
            cfg.strategy.bucket_mb,
            cfg.strategy.credit,
            pacer,
            message_batch=t.batch_size,
            message_image=t.image_size,
            variable_placement=cfg.strategy.variable_placement,
            variable_update=cfg.strategy.variable_update,
            step_barrier=cfg.strategy.step_barrier,
        )
        strategy = build(setup)
        batches = _batches(cfg, topo, env.rank, device, shards, targets)
        role = topo.role(env.rank)
        total = t.warmup_steps + t.measure_steps
        progress = Progress(total, topo.num_workers * t.batch_size, _print_now) if env.rank == 0 else None
        gate = open_gate(t.gate, t.gate_jobs, cfg.cluster.timeout_s, env.rank)
        timeline["set_up"] = time.time()
        rows, start, wire_start = [], window_edge(device), None
        _collect_between_steps()
        for step in range(total):
            if step == t.warmup_steps:
                if gate is not None:
                    gate.meet()  # the workload's windows start together
                start, wire_start = _measured_edge(device)
                timeline["window_start"] = time.time()
                if pacer is not None:
                    pacer.needed = 0.0  # the window's units only: the first steps allocate and rebuild buckets
            _maybe_fail(env.rank, step)
            began = time.perf_counter()
            batch, data_wait_s = None, 0.0  # server ranks read no batches
            if batches is not None:
                batch = next(batches)
                data_wait_s = time.perf_counter() - began
            strategy.step(batch)
            if step in (t.warmup_steps - 1, total - 1):
                strategy.finish()  # transfers left in flight land before a window edge, inside this step
            synchronize(device)
            phase = WARMUP if step < t.warmup_steps else MEASURE
            step_time_s = time.perf_counter() - began
            times = StepTimes(step_time_s, data_wait_s)
            if pacer is not None:
                overruns, stalls = pacer.take()
                times = StepTimes(step_time_s, data_wait_s, overruns, pacer.late_s(), stalls)
            rows.append(step_record(env.rank, role, step, phase, times, comm.take()))
            if progress is not None:
                progress.step(step, phase, step_time_s)
            gc.collect()
        end, wire_end = _measured_edge(device)
        timeline["window_end"] = time.time()
        tail_steps = 0
        if gate is not None:
            gate.check_out()
            while not gate.all_out():  # keep loading the shared link, unmeasured, until every job's window closed
                strategy.step(None if batches is None else next(batches))
                comm.take()
                if pacer is not None:
                    pacer.take()
                tail_steps += 1
            strategy.finish()
        gathered: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
        mine = {
            "rows": rows,
            "wire_start": wire_start,
            "wire_end": wire_end,
            "host": socket.gethostname(),
            "threads": torch.get_num_threads(),
            "peak_rss_mb": hardware.peak_rss_mb(),
            "keeps_freed": keeps_freed,
            "needed_factor": 0.0 if pacer is None else pacer.needed,
            "tail_steps": tail_steps,
        }
        dist.gather_object(mine, gathered, dst=0)
        timeline["gathered"] = time.time()
    finally:
        gc.enable()
        dist.destroy_process_group()
    if gathered is None:
        return None
    return RankResult(
        window_s=end - start,
        device=str(device),
        backend=backend,
        rows=[row for g in gathered for row in g["rows"]],
        wire=_wire_gb([g["wire_start"] for g in gathered], [g["wire_end"] for g in gathered], t.measure_steps),
        hosts=[g["host"] for g in gathered],
        threads=[g["threads"] for g in gathered],
        peak_rss_mb=[g["peak_rss_mb"] for g in gathered],
        keeps_freed=[g["keeps_freed"] for g in gathered],
        needed_factor=[g["needed_factor"] for g in gathered],
        tail_steps=[g["tail_steps"] for g in gathered],
        timeline=timeline,
    )


def main(argv: list[str]) -> int:
    """Entry point of one rank started by the driver."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description="one rank of a training run")
    parser.add_argument("--rank-result", required=True, type=Path, help="where rank 0 writes the gathered records")
    parser.add_argument("--split", type=int, help="RALP split point resolved by the driver (none for ps/allreduce)")
    parser.add_argument("--shards", type=Path, help="prepared shards a shard loader reads (resolved by the driver)")
    parser.add_argument("--dilation", help="padded times of a dilated run as JSON (resolved by the driver)")
    parser.add_argument("--calibrate", action="store_true", help="run undilated, measuring against --dilation")
    parser.add_argument("--hosts", help="each rank's host as a JSON list (resolved by the driver)")
    parser.add_argument("config", help="resolved configuration as JSON")
    args = parser.parse_args(argv)
    cfg = from_dict(json.loads(args.config))
    env = RankEnv.from_environ()
    targets = None if args.dilation is None else Targets.from_dict(json.loads(args.dilation))
    device_type, backend = os.environ[DEVICE_ENV], os.environ[BACKEND_ENV]
    hosts = None if args.hosts is None else json.loads(args.hosts)
    result = run_rank(cfg, env, device_type, backend, args.split, args.shards, targets, args.calibrate, hosts)
    if result is not None:
        write_json_atomic(args.rank_result, result)
    return 0


if __name__ == "__main__":  # an srun task, ended as a forked rank ends
    exit_now(main(sys.argv[1:]))
