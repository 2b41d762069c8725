"""The run's metrics on a hand-computed example: images/sec and GB/step by category from step rows."""

from __future__ import annotations

from typing import Any

import pytest

from ralp_pipe.engine.metrics import MEASURE, WARMUP, summarize
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
