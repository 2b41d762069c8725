"""The run's metrics on hand-computed examples: images/sec and GB/step from step rows, a step's parts, progress."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ralp_pipe.engine.comm import StepTraffic
from ralp_pipe.engine.metrics import MEASURE, ROLLING_STEPS, WARMUP, Progress, StepTimes, step_record, summarize
from ralp_pipe.engine.volume import CATEGORIES

# Two workers (ranks 0, 1) with batch 4 and one PS (rank 2); steps 0-1 warm up, steps 2-4 are measured.
WORKERS, BATCH, MEASURE_STEPS, WINDOW_S = 2, 4, 3, 1.5
WARMUP_STEPS = (0, 1)
MEASURED_STEPS = (2, 3, 4)


def row(rank: int, step: int, **sent: float) -> dict[str, Any]:
    """One steps.parquet row of `rank` at `step` sending `sent` bytes by category (0 for the others)."""
    phase = WARMUP if step in WARMUP_STEPS else MEASURE
    role = "ps" if rank == 2 else "worker"
    return {
        "rank": rank,
        "role": role,
        "step": step,
        "phase": phase,
        "step_time_s": 0.5,
        "compute_s": 0.4,
        "comm_wait_s": 0.1,
        **{f"bytes_{name}": float(sent.get(name, 0)) for name in CATEGORIES},
    }


def hand_rows() -> list[dict[str, Any]]:
    """Rows of every rank and step: uneven bytes per rank, per step and per category."""
    rows = []
    for step in WARMUP_STEPS:  # warm-up traffic is huge: counting any of it would show at once
        rows += [row(rank, step, gradients=1e12, parameters=1e12, activations=1e12, labels=1e12) for rank in range(3)]
    for i, step in enumerate(MEASURED_STEPS):
        rows.append(row(0, step, gradients=0.2e9, activations=1e6, labels=32))
        rows.append(row(1, step, gradients=0.4e9, activations=3e6, labels=32))
        rows.append(row(2, step, parameters=(0.5 + 0.2 * i) * 1e9))  # 0.5, 0.7, 0.9 GB on steps 2, 3, 4
    return rows


def test_summary_of_hand_written_rows_matches_the_hand_computed_figures() -> None:
    """images/sec, step time and GB/step per category and in total, worked out by hand."""
    result = summarize(hand_rows(), WINDOW_S, WORKERS, BATCH, MEASURE_STEPS)
    # images per step = workers x batch = 2 x 4 = 8; images/sec = 8 x 3 steps / 1.5 s = 16
    assert result.images_per_step == 8
    assert result.images_per_sec == pytest.approx(16.0)
    # step time = window / measured steps = 1.5 / 3 = 0.5 s
    assert result.step_time_s == pytest.approx(0.5)
    gb = result.gb_per_step
    # gradients: ranks 0 + 1 send 0.2 + 0.4 = 0.6 GB every measured step -> 0.6 GB/step
    assert gb["gradients"] == pytest.approx(0.6)
    # parameters: the PS sends 0.5, 0.7, 0.9 GB -> (0.5 + 0.7 + 0.9) / 3 = 0.7 GB/step
    assert gb["parameters"] == pytest.approx(0.7)
    # activations: 1e6 + 3e6 bytes per step -> 4e6 / 1e9 = 0.004 GB/step
    assert gb["activations"] == pytest.approx(0.004)
    # labels: 32 + 32 bytes per step -> 64 / 1e9 = 6.4e-8 GB/step
    assert gb["labels"] == pytest.approx(6.4e-8)
    assert gb["activation_gradients"] == 0.0
    # total: 0.6 + 0.7 + 0.004 + 0.000000064 = 1.304000064 GB/step
    assert gb["total"] == pytest.approx(1.304000064)
    assert set(gb) == {"total", *CATEGORIES}


def test_row_order_does_not_change_the_summary() -> None:
    """Ranks report in any order: the figures only depend on the rows' contents."""
    rows = hand_rows()
    forward = summarize(rows, WINDOW_S, WORKERS, BATCH, MEASURE_STEPS)
    backward = summarize(rows[::-1], WINDOW_S, WORKERS, BATCH, MEASURE_STEPS)
    assert forward == backward


@pytest.mark.parametrize("missing", MEASURED_STEPS)
def test_a_missing_measured_step_is_refused_with_the_counts(missing: int) -> None:
    """A measured step absent from every rank's rows is an error naming expected and found counts."""
    rows = [r for r in hand_rows() if r["step"] != missing]
    with pytest.raises(ValueError, match="expected 3 measured steps in the records, found 2"):
        summarize(rows, WINDOW_S, WORKERS, BATCH, MEASURE_STEPS)


def test_warm_up_rows_do_not_count_as_measured_steps() -> None:
    """Warm-up rows alone are not a measured window: the error says none were found."""
    rows = [r for r in hand_rows() if r["phase"] == WARMUP]
    with pytest.raises(ValueError, match="expected 3 measured steps in the records, found 0"):
        summarize(rows, WINDOW_S, WORKERS, BATCH, MEASURE_STEPS)


def test_data_wait_is_its_own_column_and_not_counted_as_compute() -> None:
    """A 1 s step with 0.3 s in the loader and 0.2 s on transfers leaves 0.5 s of compute."""
    traffic = StepTraffic(dict.fromkeys(CATEGORIES, 0), {}, comm_wait_s=0.2)
    record = step_record(0, "worker", 3, MEASURE, StepTimes(1.0, 0.3), traffic)
    assert record["data_wait_s"] == pytest.approx(0.3)
    assert record["comm_wait_s"] == pytest.approx(0.2)
    assert record["compute_s"] == pytest.approx(0.5)  # 1.0 - 0.2 - 0.3


class FakeClock:
    """A clock the test advances by each step's time, as the rank loop's wall clock would."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def progress_lines(step_times: list[float], images_per_step: int = 8) -> list[str]:
    """The lines Progress writes for steps of `step_times` seconds (1 warm-up step, then measured)."""
    lines: list[str] = []
    clock = FakeClock()
    progress = Progress(len(step_times), images_per_step, lines.append, clock)
    for step, seconds in enumerate(step_times):
        clock.now += seconds
        progress.step(step, WARMUP if step == 0 else MEASURE, seconds)
    return lines


def test_progress_of_fast_steps_is_written_every_few_seconds_and_at_the_end() -> None:
    """120 steps of 0.125 s: a line at the first step, one every PROGRESS_EVERY_S (5 s = 40 steps), the last."""
    lines = progress_lines([0.125] * 120)  # 0.125 is exact in binary: the clock's sums are exact too
    # first line at t=0.125 s (step 1), then at t >= 5.125 s (step 41) and t >= 10.125 s (step 81), then step 120
    assert [line.split(" ")[1] for line in lines] == ["1/120", "41/120", "81/120", "120/120"]
    assert lines[0].startswith("step 1/120 (warmup): 0.125 s")
    # rolling: 8 images a step over the last 10 steps of 0.125 s = 80 / 1.25 = 64 images/s
    assert lines[-1] == "step 120/120 (measure): 0.125 s, 64.00 images/s over the last 10 steps"


def test_progress_of_slow_steps_is_written_every_step_with_a_rolling_rate() -> None:
    """Steps of a second or more each get a line; the rate covers the last ROLLING_STEPS steps only."""
    times = [1.0] * 12 + [4.0]
    lines = progress_lines(times)
    assert len(lines) == len(times)
    # last 10 steps: nine of 1 s and one of 4 s = 13 s for 80 images -> 6.15 images/s
    assert lines[-1] == "step 13/13 (measure): 4.000 s, 6.15 images/s over the last 10 steps"
    assert ROLLING_STEPS == 10


def test_a_runs_link_rate_is_the_shaped_rate_else_the_probed_one() -> None:
    from ralp_pipe.contract.records import Plan
    from ralp_pipe.engine.metrics import CONFIGURED, PROBED, link_rate

    probed = Plan(strategies={}, bandwidth_bytes_per_s=0.97e9 / 8, bandwidth_source="measured")
    assert link_rate("1gbit", "emulated", probed) == (1.0, CONFIGURED)  # the tc rate wins where links are shaped
    assert link_rate("unlimited", "slurm", probed) == (pytest.approx(0.97), PROBED)  # a fabric: what was probed
    configured = Plan(strategies={}, bandwidth_bytes_per_s=0.97e9 / 8, bandwidth_source="configured 1gbit")
    gbit, source = link_rate("unlimited", "local", configured)
    assert math.isnan(gbit) and source is None
