"""Aggregation: runs.parquet, speedups, summary.md and plots from run records and plans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.config import ConfigError
from ralp_pipe.results.aggregate import build_tables, load_records, load_workloads
from ralp_pipe.results.layout import PLOT_NAMES
from workflow_records import gb_per_step, images_per_sec, prediction_error, write_concurrent, write_results


def test_runs_table_has_one_row_per_run_with_speedup_and_prediction_error(tmp_path: Path) -> None:
    runs = write_results(tmp_path)
    tables = build_tables(load_records(runs, tmp_path / "plans"))
    frame = tables.runs
    assert len(frame) == len(runs) == 16
    row = frame[(frame.model == "vgg11") & (frame.gpus == 4) & (frame.strategy == "ralp_n")].iloc[0]
    # vgg11 at N=4 on 1gbit: ralp_n 240 x 2 + 7 x 2 = 494 images/sec, ps 100 x 2 + 14 = 214
    assert row.speedup_vs_ps == pytest.approx(494 / 214)
    assert row.speedup_vs_ps == pytest.approx(
        images_per_sec("vgg11", "1gbit", "ralp_n", 4) / images_per_sec("vgg11", "1gbit", "ps", 4)
    )
    assert row.prediction_error == pytest.approx(0.03)  # ralp_n's 0.02 + 0.005 per GPU beyond 2
    assert row.prediction_error == pytest.approx(prediction_error("vgg11", "1gbit", "ralp_n", 4))
    assert row.predicted_gb_per_step == pytest.approx(0.12)  # the plan predicts the analytic volume
    assert row.workers == 3 and row.num_ps == 1 and row.classes == 1000
    assert row.gb_total == pytest.approx(0.12) == gb_per_step("vgg11", "ralp_n", 4)["total"]  # 0.06 x N/2
    assert row.wire_gb_total == pytest.approx(1.02 * 0.12)  # kernel counters of the emulated network
    assert json.loads(row.hardware) == {"cpu": "test", "cpus": 2}
    assert list(frame.strategy[:4]) == ["ps", "allreduce", "ralp_h", "ralp_n"]
    ps_rows = tables.speedups[tables.speedups.strategy == "ps"]
    assert (ps_rows.speedup == 1.0).all()


def test_summary_is_laid_out_per_network_with_throughput_and_speedup_columns(tmp_path: Path) -> None:
    tables = build_tables(load_records(write_results(tmp_path), tmp_path / "plans"))
    lines = tables.summary.splitlines()
    assert "## Network 1gbit (1gbit)" in lines
    header = next(line for line in lines if line.startswith("| model") and "speedup" in line)
    assert header == (
        "| model | dataset | classes | N | ps | allreduce | ralp_h | ralp_n | allreduce speedup |"
        " ralp_h speedup | ralp_n speedup |"
    )
    # THROUGHPUT x 2 + 14 at N=4; speedups 314 / 214, 374 / 214, 494 / 214
    assert "| vgg11 | synthetic1k | 1000 | 4 | 214.0 | 314.0 | 374.0 | 494.0 | 1.47x | 1.75x | 2.31x |" in lines
    # |errors| 0, .01, .02, .03, .03, .04, .05, .06 | .10, .11, .13, .14, .25, .26, .28, .29: median (.06 + .10) / 2
    assert "Median absolute error of predicted images/sec: 8.0% over 16 runs with a plan." in lines


def test_missing_plan_leaves_prediction_empty_and_missing_ps_leaves_speedup_empty(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("allreduce", "ralp_n"), gpus=(2,))
    (tmp_path / "plans" / "synthetic1k" / "vgg11" / "n2-1gbit.json").unlink()
    frame = build_tables(load_records(runs, tmp_path / "plans")).runs
    assert frame.predicted_images_per_sec.isna().all() and frame.speedup_vs_ps.isna().all()
    assert not math.isnan(frame.images_per_sec.iloc[0])


def test_duplicate_and_missing_records_are_refused_by_name(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "metrics.json").write_text((runs[0] / "metrics.json").read_text())
    with pytest.raises(ConfigError, match="several records of the same run: synthetic1k/vgg11/n2-1gbit/ps"):
        build_tables(load_records([runs[0], copy], tmp_path / "plans"))
    with pytest.raises(ConfigError, match="nowhere.*does not exist"):
        load_records([tmp_path / "nowhere"], tmp_path / "plans")


def test_cli_writes_tables_and_every_plot(tmp_path: Path) -> None:
    write_results(tmp_path, models=("vgg11",), gpus=(2, 4))
    out = tmp_path / "tables"
    assert (
        cli(["aggregate", "--runs", str(tmp_path / "runs"), "--plans", str(tmp_path / "plans"), "--out", str(out)]) == 0
    )
    assert len(pd.read_parquet(out / "runs.parquet")) == 8
    assert set(pd.read_parquet(out / "speedups.parquet").columns) >= {"speedup", "ps_images_per_sec"}
    assert (out / "summary.md").read_text().startswith("# Results")
    for name in PLOT_NAMES:
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_concurrent_workloads_get_a_table_and_a_summary_section(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,))
    workloads = load_workloads([write_concurrent(tmp_path)])
    tables = build_tables(load_records(runs, tmp_path / "plans"), workloads)
    assert list(tables.concurrent.slowdown) == pytest.approx([2.0, 100 / 60])
    assert "## Concurrent workloads on one network" in tables.summary
    assert "| w0 | 1 | `strategy=ps model=resnet18` | 100.0 | 60.0 | 1.67x |" in tables.summary.splitlines()
    assert build_tables(load_records(runs, tmp_path / "plans")).concurrent.empty
