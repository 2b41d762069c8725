"""The time breakdown (results/breakdown.py) on hand-computed step records, and in the aggregated tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ralp_pipe.contract.layout import BREAKDOWN_TABLE
from ralp_pipe.contract.records import RunMetrics
from ralp_pipe.errors import DataError
from ralp_pipe.results.aggregate import build_tables, load_records, write_tables
from ralp_pipe.results.breakdown import breakdown_markdown, breakdown_table, run_breakdown
from workflow_records import SERVER_STEP, STEP_PARTS, metrics, write_results


def record(strategy: str = "ps", gpus: int = 2, repeat: int = 0) -> RunMetrics:
    """A run record of vgg11 (repeat `repeat`)."""
    doc = metrics("vgg11", "synthetic1k", strategy, gpus, repeat=repeat)
    return RunMetrics.from_dict(doc, "test")


def step(rank: int, role: str, number: int, phase: str, step_s: float, comm_s: float, data_s: float) -> dict[str, Any]:
    """One steps.parquet row; compute is what the two waits leave of the step."""
    return dict(
        rank=rank,
        role=role,
        step=number,
        phase=phase,
        step_time_s=step_s,
        compute_s=step_s - comm_s - data_s,
        comm_wait_s=comm_s,
        data_wait_s=data_s,
    )


def hand_steps() -> pd.DataFrame:
    """Two workers and a PS; a huge warm-up step each (ignored), then two measured steps."""
    rows = [
        step(rank, role, 0, "warmup", 100.0, 50.0, 40.0) for rank, role in ((0, "worker"), (1, "worker"), (2, "ps"))
    ]
    rows += [
        step(0, "worker", 1, "measure", 1.0, 0.3, 0.2),
        step(0, "worker", 2, "measure", 2.0, 0.7, 0.2),
        step(1, "worker", 1, "measure", 1.0, 0.4, 0.0),
        step(1, "worker", 2, "measure", 2.0, 0.6, 0.4),
        step(2, "ps", 1, "measure", 1.5, 1.2, 0.0),  # compute 0.3
        step(2, "ps", 2, "measure", 1.5, 1.0, 0.0),  # compute 0.5
    ]
    return pd.DataFrame(rows)


def test_a_runs_breakdown_is_the_mean_over_its_workers_measured_steps_with_the_servers_beside() -> None:
    row = run_breakdown(record(), hand_steps())
    # workers' measured steps: 1.0, 2.0, 1.0, 2.0 s -> 1.5 s
    assert row["step_time_s"] == pytest.approx(1.5)
    # communication wait 0.3, 0.7, 0.4, 0.6 -> 0.5 s; data wait 0.2, 0.2, 0.0, 0.4 -> 0.2 s
    assert row["comm_wait_s"] == pytest.approx(0.5) and row["data_wait_s"] == pytest.approx(0.2)
    # compute is the rest: 0.5, 1.1, 0.6, 1.0 -> 0.8 s, and the parts add up to the step
    assert row["compute_s"] == pytest.approx(0.8)
    assert row["compute_s"] + row["comm_wait_s"] + row["data_wait_s"] == pytest.approx(row["step_time_s"])
    assert row["comm_share"] == pytest.approx(0.5 / 1.5)
    # the PS: compute 0.3 and 0.5 -> 0.4 s, waits 1.2 and 1.0 -> 1.1 s
    assert row["ps_compute_s"] == pytest.approx(0.4) and row["ps_comm_wait_s"] == pytest.approx(1.1)
    assert (row["strategy"], row["repeat"], row["run"]) == ("ps", 0, "synthetic1k/vgg11/n2-1gbit/ps/r0")


def test_steps_from_before_data_wait_was_timed_have_a_null_data_wait() -> None:
    """Old steps.parquet (no data_wait_s): the loader's time is inside compute, and data wait is unknown."""
    old = hand_steps().drop(columns="data_wait_s")
    row = run_breakdown(record(), old)
    assert math.isnan(row["data_wait_s"])
    assert row["compute_s"] == pytest.approx(0.8) and row["comm_wait_s"] == pytest.approx(0.5)


def test_a_run_without_servers_has_null_server_times() -> None:
    steps = hand_steps()
    row = run_breakdown(record("allreduce"), steps[steps["role"] == "worker"])
    assert math.isnan(row["ps_compute_s"]) and math.isnan(row["ps_comm_wait_s"])


@pytest.mark.parametrize("missing", ["comm_wait_s", "phase"])
def test_steps_without_a_needed_column_are_refused_naming_the_run(missing: str) -> None:
    with pytest.raises(DataError, match=rf"synthetic1k/vgg11/n2-1gbit/ps/r0 lacks column '{missing}'"):
        run_breakdown(record(), hand_steps().drop(columns=missing))


def scaled(share: float) -> pd.DataFrame:
    """hand_steps with the workers' communication wait set to `share` of each step (data wait 0)."""
    steps = hand_steps()
    workers = steps["role"] == "worker"
    steps.loc[workers, "comm_wait_s"] = share * steps.loc[workers, "step_time_s"]
    steps.loc[workers, "data_wait_s"] = 0.0
    steps["compute_s"] = steps["step_time_s"] - steps["comm_wait_s"] - steps["data_wait_s"]
    return steps


def test_the_summary_gives_the_ps_share_of_communication_averaged_per_configuration() -> None:
    """N=2 has repeats with 50% and 70% (mean 60%), N=4 one with 30%: 45% per configuration (runs: 50%)."""
    runs = [
        (record("ps", 2, 0), scaled(0.5)),
        (record("ps", 2, 1), scaled(0.7)),
        (record("ps", 4, 0), scaled(0.3)),
        (record("allreduce", 4, 0), scaled(0.9)),  # not a ps step
    ]
    text = breakdown_markdown(breakdown_table(runs))
    assert "Communication wait is 45% of a `ps` worker's step on average (30% to 60% over 2 configurations)." in text
    table = [line for line in text.splitlines() if line.startswith("| vgg11")]
    assert len(table) == 3  # one row per configuration
    assert table[0].split(" | ")[4:6] == ["ps", "1.500"] and table[0].split(" | ")[9] == "60%"


@pytest.mark.slow
def test_aggregate_writes_one_breakdown_row_per_run_in_the_tables_order(tmp_path: Path) -> None:
    """From the fixture's steps (fixed shares of every step): shares as written, server beside, sorted as repeats."""
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,), repeats=2)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    breakdown = tables.breakdown
    assert list(breakdown["run"]) == list(tables.repeats["run"])
    assert breakdown["comm_share"].to_numpy() == pytest.approx(STEP_PARTS["comm_wait_s"])
    first = json.loads((runs[0] / "metrics.json").read_text())
    # the fixture's worker steps are 0.8, 1.0, 1.15, 0.9, 1.1, 0.95 x the run's step time: mean 0.98333 x
    row = breakdown[breakdown["run"] == "synthetic1k/vgg11/n2-1gbit/ps/r0"].iloc[0]
    assert row["step_time_s"] == pytest.approx(5.9 / 6 * first["step_time_s"])
    # a server waits for no data: its compute is what its communication wait leaves of the step
    assert row["ps_compute_s"] == pytest.approx((1 - STEP_PARTS["comm_wait_s"]) * SERVER_STEP * first["step_time_s"])
    assert "## Time breakdown of a step" in tables.summary
    write_tables(tables, tmp_path / "tables", plots=False)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tables" / BREAKDOWN_TABLE), breakdown)
