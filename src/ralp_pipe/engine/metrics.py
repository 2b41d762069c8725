"""The run's metrics, defined once.

- images/sec: images processed by all workers together in the measured window / wall time of
  the window. The window is the `measure_steps` steps after `warmup_steps`, bounded by
  barriers (and device synchronisation on GPU); its wall time is rank 0's.
- GB/step by category: bytes the comm layer counted at the senders in one step, summed over
  ranks, averaged over the measured steps, / 1e9.
- per-step records, one per (rank, step): step time, communication wait (time blocked on
  transfers) and compute (step time minus communication wait), and bytes sent by category.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ralp_pipe.engine.comm import StepTraffic
from ralp_pipe.engine.volume import CATEGORIES

WARMUP, MEASURE = "warmup", "measure"


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window_edge(device: torch.device, group: dist.ProcessGroup | None = None) -> float:
    """Device sync, barrier over all ranks, then the clock: one edge of the measured window."""
    synchronize(device)
    dist.barrier(group=group)
    return time.perf_counter()


def step_record(
    rank: int, role: str, step: int, phase: str, step_time_s: float, traffic: StepTraffic
) -> dict[str, Any]:
    """One row of steps.parquet."""
    row: dict[str, Any] = {
        "rank": rank,
        "role": role,
        "step": step,
        "phase": phase,
        "step_time_s": step_time_s,
        "compute_s": max(step_time_s - traffic.comm_wait_s, 0.0),
        "comm_wait_s": traffic.comm_wait_s,
    }
    row.update({f"bytes_{name}": traffic.bytes_by_category[name] for name in CATEGORIES})
    return row


def gb_per_step(bytes_per_step: dict[str, float]) -> dict[str, float]:
    """Bytes per step by category -> GB per step by category plus "total"."""
    gb = {name: bytes_per_step.get(name, 0) / 1e9 for name in CATEGORIES}
    return {"total": sum(gb.values()), **gb}


@dataclass(frozen=True)
class Throughput:
    """The measured window's figures."""

    images_per_sec: float
    images_per_step: int
    step_time_s: float
    gb_per_step: dict[str, float]


def summarize(
    rows: list[dict[str, Any]], window_s: float, workers: int, batch_size: int, measure_steps: int
) -> Throughput:
    """Throughput and GB/step of the measured window from all ranks' step records."""
    measured = [r for r in rows if r["phase"] == MEASURE]
    steps = {r["step"] for r in measured}
    if len(steps) != measure_steps:
        raise ValueError(f"expected {measure_steps} measured steps in the records, found {len(steps)}")
    totals = {name: sum(r[f"bytes_{name}"] for r in measured) / measure_steps for name in CATEGORIES}
    images_per_step = workers * batch_size
    return Throughput(
        images_per_sec=images_per_step * measure_steps / window_s,
        images_per_step=images_per_step,
        step_time_s=window_s / measure_steps,
        gb_per_step=gb_per_step(totals),
    )
