"""Run a Python function on every rank of a gloo group of spawned processes (tests and benchmarks)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime.launch import RankEnv, init_group
from ralp_pipe.runtime.process import free_port


def _run_function(
    rank: int, fn: Callable[..., Any], world_size: int, port: int, out: str, args: tuple[Any, ...], threads: int
) -> None:
    torch.set_num_threads(threads)
    env = RankEnv(rank, world_size, rank, "127.0.0.1", port)
    init_group(env, "gloo", 60, 300)
    try:
        torch.save(fn(rank, world_size, *args), Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn_function(
    fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = (), timeout_s: float = 300, threads: int = 1
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on `world_size` spawned ranks of a gloo group (`threads` torch threads each)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ralp-spawn-") as out:
        context = mp.start_processes(
            _run_function,
            args=(fn, world_size, port, out, args, threads),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                for proc in context.processes:
                    proc.kill()
                raise RunFailure(f"spawned ranks still running after {timeout_s:.0f} s")
        return [torch.load(Path(out) / f"{rank}.pt", weights_only=False) for rank in range(world_size)]
