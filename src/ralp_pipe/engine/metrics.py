"""The run's metrics, defined once.

- images/sec: images processed by all workers together in the measured window / wall time of
  the window. The window is the `measure_steps` steps after `warmup_steps`, bounded by
  barriers (and device synchronisation on GPU); its wall time is rank 0's.
- GB/step by category: bytes the comm layer counted at the senders in one step, summed over
  ranks, averaged over the measured steps, / 1e9.
- per-step records, one per (rank, step): step time (from asking the loader for the batch to
  the step's end), data wait (blocked in the loader's ``next()``; 0 on ranks without a loader),
  communication wait (blocked on transfers) and compute (step time minus both waits), bytes
  sent by category, and overruns: padded units whose real compute outlasted D x the target's
  time (:mod:`ralp_pipe.engine.dilation`; 0 in an undilated run).
- target-equivalent images/sec of a dilated run: measured images/sec x the dilation factor D.
- progress (:class:`Progress`, rank 0): step k/n, the last step's time and the rolling
  images/sec of the last :data:`ROLLING_STEPS` steps, every step when steps take a second or
  more, else every :data:`PROGRESS_EVERY_S` seconds, and the last step.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from ralp_pipe.config import cluster_kind
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.contract.records import Plan
from ralp_pipe.engine.comm import StepTraffic
from ralp_pipe.engine.volume import CATEGORIES

WARMUP, MEASURE = "warmup", "measure"
CONFIGURED, PROBED = "configured tc rate", "probed"  # where a run's link rate comes from (link_source)
PROGRESS_EVERY_S = 5.0  # at most this long between two progress lines
ROLLING_STEPS = 10  # the rolling images/sec is over this many last steps


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window_edge(device: torch.device, group: dist.ProcessGroup | None = None) -> float:
    """Device sync, barrier over all ranks, then the clock: one edge of the measured window."""
    synchronize(device)
    dist.barrier(group=group)
    return time.perf_counter()


def compute_time(step_time_s: float, comm_wait_s: float, data_wait_s: float) -> float:
    """A step's compute: what the communication and data waits leave of it (never negative)."""
    return max(step_time_s - comm_wait_s - data_wait_s, 0.0)


@dataclass(frozen=True)
class StepTimes:
    """How one rank's step went: its wall time, its wait for the next batch and, dilated, its overruns, its
    stalls and the lateness against the target left at its end (engine/dilation.py)."""

    step_time_s: float
    data_wait_s: float
    overruns: int = 0
    late_s: float = 0.0
    stalls: int = 0


def step_record(rank: int, role: str, step: int, phase: str, times: StepTimes, traffic: StepTraffic) -> dict[str, Any]:
    """One row of steps.parquet."""
    row: dict[str, Any] = {
        "rank": rank,
        "role": role,
        "step": step,
        "phase": phase,
        "step_time_s": times.step_time_s,
        "compute_s": compute_time(times.step_time_s, traffic.comm_wait_s, times.data_wait_s),
        "comm_wait_s": traffic.comm_wait_s,
        "data_wait_s": times.data_wait_s,
        "overruns": times.overruns,
        "stalls": times.stalls,
        "late_s": times.late_s,
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


def measured_overruns(rows: list[dict[str, Any]]) -> int:
    """Overruns of all ranks in the measured steps (0 in records from before dilation)."""
    return sum(int(r.get("overruns", 0)) for r in rows if r["phase"] == MEASURE)


def measured_stalls(rows: list[dict[str, Any]]) -> int:
    """Stalls of all ranks in the measured steps: units late only because the host ran another thread."""
    return sum(int(r.get("stalls", 0)) for r in rows if r["phase"] == MEASURE)


def measured_late_s(rows: list[dict[str, Any]]) -> float:
    """The largest lateness against the target's timeline a rank carried at the end of a measured step (0 undilated)."""
    return max((float(r.get("late_s", 0.0)) for r in rows if r["phase"] == MEASURE), default=0.0)


def target_equivalent(images_per_sec: float, factor: float | None) -> float | None:
    """A dilated run's target-equivalent images/sec: measured x the dilation factor (None when undilated)."""
    return None if factor is None else images_per_sec * factor


@dataclass
class Progress:
    """Rank 0's progress lines while training (see the module docstring for when it writes one)."""

    total_steps: int
    images_per_step: int
    write: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    _recent: deque[float] = field(default_factory=lambda: deque(maxlen=ROLLING_STEPS))
    _last_line_at: float | None = None

    def step(self, step: int, phase: str, step_time_s: float) -> None:
        """Note that `step` (0-based) of `phase` took `step_time_s`; write a line when one is due."""
        self._recent.append(step_time_s)
        now = self.clock()
        last = step + 1 == self.total_steps
        due = self._last_line_at is None or now - self._last_line_at >= PROGRESS_EVERY_S
        if not (last or due or step_time_s >= 1.0):
            return
        self._last_line_at = now
        rolling = self.images_per_step * len(self._recent) / max(sum(self._recent), 1e-12)
        self.write(
            f"step {step + 1}/{self.total_steps} ({phase}): {step_time_s:.3f} s, "
            f"{rolling:.2f} images/s over the last {len(self._recent)} step{'s' * (len(self._recent) > 1)}"
        )


def link_rate(rate: str, kind: str | None, plan: Plan | None) -> tuple[float, str | None]:
    """A run's link in Gbit/s and where that figure comes from: the tc rate where its cluster kind shapes links
    to `rate`, else the payload rate the link probe measured (the `plan`'s, where it priced the probe's);
    NaN and None where neither is known (an unshaped link and no probed plan)."""
    bits = rate_bits_per_s(rate, "rate") if kind is not None and cluster_kind(kind).shapes_links else None
    if bits is not None:
        return bits / 1e9, CONFIGURED
    if plan is not None and plan.bandwidth_source == "measured" and plan.bandwidth_bytes_per_s:
        return 8 * plan.bandwidth_bytes_per_s / 1e9, PROBED
    return math.nan, None
