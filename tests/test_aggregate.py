"""Aggregation: runs.parquet, speedups, summary.md and plots from run records and plans."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.config import ConfigError
from ralp_pipe.contract.layout import PLOT_NAMES
from ralp_pipe.errors import DataError
from ralp_pipe.results.aggregate import build_tables, load_records, load_workloads
from workflow_records import gb_per_step, images_per_sec, prediction_error, write_concurrent, write_results


@pytest.mark.slow
def test_runs_table_has_one_row_per_run_with_speedup_and_prediction_error(tmp_path: Path) -> None:
    runs = write_results(tmp_path)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
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
    assert (ps_rows.speedup_vs_ps == 1.0).all()
    # one repeat: no standard deviation and no interval, as nulls
    assert row.repeats == 1 and math.isnan(row.images_per_sec_std) and math.isnan(row.speedup_vs_ps_ci_low)


def test_columns_per_device_split_name_and_nulls(tmp_path: Path) -> None:
    """Per-device images/sec, speedup over allreduce, the split's unit and index, nulls where there is none."""
    frame = build_tables(load_records(write_results(tmp_path, models=("vgg11",), gpus=(4,)), [tmp_path / "plans"])).runs
    cells = frame.set_index("strategy")
    # vgg11 at N=4: ps 214 images/sec on 4 workers + 1 PS, ralp_h 374 on 2 workers + the PS device
    assert cells.loc["ps", "devices"] == 5 and cells.loc["ps", "images_per_sec_per_device"] == pytest.approx(214 / 5)
    assert cells.loc["ralp_h", "devices"] == 3 and cells.loc["ralp_h", "global_batch"] == 2 * 2
    assert cells.loc["ralp_h", "speedup_vs_allreduce"] == pytest.approx(374 / 314)
    assert cells.loc["allreduce", "speedup_vs_allreduce"] == 1.0
    assert cells.loc["ralp_n", "split"] == 8 and cells.loc["ralp_n", "split_unit"] == "layer4.0"
    assert cells.loc["ps", "split"] is pd.NA and cells.loc["ps", "split_unit"] is pd.NA
    assert str(frame["split"].dtype) == "Int64"


def test_step_percentiles_are_of_the_slowest_worker_per_measured_step(tmp_path: Path) -> None:
    """p50/p95 of the measured steps, each as long as its slowest worker; warm-up and PS rows are left out."""
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,))
    repeats = build_tables(load_records(runs, [tmp_path / "plans"])).repeats
    mean = repeats.step_time_s.iloc[0]
    # workers' steps x mean: (0.8, 1.0, 1.15) and (0.9, 1.1, 0.95) -> slowest 0.9, 1.1, 1.15: p50 1.1, p95 1.145
    assert repeats.step_p50_s.iloc[0] == pytest.approx(1.1 * mean)
    assert repeats.step_p95_s.iloc[0] == pytest.approx((1.1 + 0.9 * 0.05) * mean)


@pytest.mark.slow
def test_repeats_are_rows_of_their_own_and_aggregate_with_t_intervals(tmp_path: Path) -> None:
    """Three repeats at 1, 0.95 and 1.05 x the base in each of 5 configurations: mean 1 x; the relative SD pooled
    over the 5 (10 degrees of freedom) is the SD of ln(1, 0.95, 1.05); half-width t(0.975, 10) x sd / sqrt 3."""
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,), repeats=3, sequential=("ps",))
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    assert len(tables.repeats) == 15 and len(tables.runs) == 5
    ps = tables.repeats[tables.repeats.strategy == "ps"]
    assert list(ps.repeat) == [0, 1, 2] and list(ps.images_per_sec) == pytest.approx([100.0, 95.0, 105.0])
    assert list(ps.run) == [f"synthetic1k/vgg11/n2-1gbit/ps/r{k}" for k in range(3)]
    row = tables.runs.set_index("strategy").loc["ralp_n"]
    relative = statistics.stdev(math.log(x) for x in (1.0, 0.95, 1.05))
    assert row.images_per_sec == pytest.approx(240.0) and row.images_per_sec_std == pytest.approx(240.0 * relative)
    assert row.images_per_sec_own_std == pytest.approx(12.0) and row.images_per_sec_df == 10
    assert row.images_per_sec_ci_high - 240.0 == pytest.approx(2.2281388519649385 * 240.0 * relative / 3**0.5)
    sequential = tables.runs.set_index("strategy").loc["ps-sequential"]
    assert not sequential.overlap and sequential.speedup_vs_ps == pytest.approx(0.5)
    assert math.isnan(sequential.predicted_images_per_sec)  # the plan priced the pipelined ps
    assert list(tables.runs.strategy) == ["ps", "ps-sequential", "allreduce", "ralp_h", "ralp_n"]
    assert "| vgg11 | synthetic1k | 1000 | 2 | ralp_n | 2 | 2 | layer4.0 (8) | 3 | 240.0 ± 15.5 |" in tables.summary


@pytest.mark.slow
def test_summary_is_laid_out_per_network_with_one_row_per_configuration(tmp_path: Path) -> None:
    tables = build_tables(load_records(write_results(tmp_path), [tmp_path / "plans"]))
    lines = tables.summary.splitlines()
    assert "## Network 1gbit (1 Gbit/s configured tc rate)" in lines
    header = next(line for line in lines if line.startswith("| model") and "vs ps" in line)
    assert header == (
        "| model | dataset | classes | N | strategy | devices | global batch | split | repeats | images/sec |"
        " per device | step p50 / p95 (s) | vs ps | vs allreduce |"
    )
    # ralp_n at N=4: 240 x 2 + 14 = 494 images/sec on 4 devices; 494 / 214 over ps, 494 / 314 over allreduce
    assert any(
        line.startswith("| vgg11 | synthetic1k | 1000 | 4 | ralp_n | 4 | 6 | layer4.0 (8) | 1 | 494.0 | 123.50 |")
        and line.endswith("| 2.31x | 1.57x |")
        for line in lines
    )
    # |errors| 0, .01, .02, .03, .03, .04, .05, .06 | .10, .11, .13, .14, .25, .26, .28, .29: median (.06 + .10) / 2
    assert "Median absolute error of predicted images/sec: 8.0% over 16 configurations with a prediction." in lines


def test_missing_plan_leaves_prediction_empty_and_missing_ps_leaves_speedup_empty(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("allreduce", "ralp_n"), gpus=(2,))
    (tmp_path / "plans" / "synthetic1k" / "vgg11" / "n2-1gbit.json").unlink()
    frame = build_tables(load_records(runs, [tmp_path / "plans"])).runs
    assert frame.predicted_images_per_sec.isna().all() and frame.speedup_vs_ps.isna().all()
    assert not math.isnan(frame.images_per_sec.iloc[0])


def test_duplicate_and_missing_records_are_refused_by_name(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "metrics.json").write_text((runs[0] / "metrics.json").read_text())
    (copy / "steps.parquet").write_bytes((runs[0] / "steps.parquet").read_bytes())
    with pytest.raises(ConfigError, match="several records of the same run: synthetic1k/vgg11/n2-1gbit/ps/r0"):
        build_tables(load_records([runs[0], copy], [tmp_path / "plans"]))
    (copy / "steps.parquet").unlink()
    with pytest.raises(DataError, match=f"cannot read step records {copy / 'steps.parquet'}"):
        load_records([copy], [tmp_path / "plans"])
    with pytest.raises(ConfigError, match="nowhere.*does not exist"):
        load_records([tmp_path / "nowhere"], [tmp_path / "plans"])


@pytest.mark.slow
def test_cli_writes_tables_and_every_plot(tmp_path: Path) -> None:
    write_results(tmp_path, models=("vgg11",), gpus=(2, 4))
    out = tmp_path / "tables"
    assert (
        cli(["aggregate", "--runs", str(tmp_path / "runs"), "--plans", str(tmp_path / "plans"), "--out", str(out)]) == 0
    )
    assert len(pd.read_parquet(out / "runs.parquet")) == 8
    assert set(pd.read_parquet(out / "speedups.parquet").columns) >= {"speedup_vs_allreduce", "ps_images_per_sec"}
    assert len(pd.read_parquet(out / "repeats.parquet")) == 8
    assert (out / "summary.md").read_text().startswith("# Results")
    for name in PLOT_NAMES:
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_concurrent_workloads_get_a_table_and_a_summary_section(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,))
    workloads = load_workloads([write_concurrent(tmp_path)])
    tables = build_tables(load_records(runs, [tmp_path / "plans"]), workloads)
    assert list(tables.concurrent.slowdown) == pytest.approx([2.0, 100 / 60])
    assert "## Concurrent workloads on one network" in tables.summary
    assert "| w0 | 2 | 1 | `strategy=ps model=resnet18` | 100.0 | 60.0 | 1.67x |" in tables.summary.splitlines()
    assert build_tables(load_records(runs, [tmp_path / "plans"])).concurrent.empty


@pytest.mark.slow
def test_each_row_names_its_link_rate_and_where_that_figure_comes_from(tmp_path: Path) -> None:
    """A shaped link shows its tc rate; an unshaped one (a cluster's fabric) the rate its link probe measured."""
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps", "ralp_n"), gpus=(2,))
    for run in runs:  # the same runs on a SLURM cluster's fabric, whose probe measured 0.97 Gbit/s
        doc = json.loads((run / "metrics.json").read_text())
        doc.update(network="fabric", rate="unlimited", config={**doc["config"], "cluster": {"kind": "slurm"}})
        (run / "metrics.json").write_text(json.dumps(doc))
    fabric = tmp_path / "plans" / "fabric.json"
    plan = json.loads((tmp_path / "plans" / "synthetic1k" / "vgg11" / "n2-1gbit.json").read_text())
    fabric.write_text(json.dumps({**plan, "network": "fabric", "bandwidth_bytes_per_s": 0.97e9 / 8,
                                  "bandwidth_source": "measured"}))  # fmt: skip
    tables = build_tables(load_records(runs, [fabric]))
    for frame in (tables.runs, tables.repeats):
        assert list(frame.link_gbit) == pytest.approx([0.97, 0.97]) and set(frame.link_source) == {"probed"}
    assert "## Network fabric (0.97 Gbit/s probed)" in tables.summary.splitlines()
    emulated = write_results(tmp_path / "emulated", models=("vgg11",), gpus=(2,), networks=("100mbit",))
    shaped = build_tables(load_records(emulated, [tmp_path / "emulated" / "plans"]))
    assert set(shaped.runs.link_gbit) == {0.1} and set(shaped.runs.link_source) == {"configured tc rate"}
    assert "## Network 100mbit (0.1 Gbit/s configured tc rate)" in shaped.summary.splitlines()
    unknown = build_tables(load_records(runs, [])).runs  # no plan, so no probe: the rate as configured
    assert unknown.link_gbit.isna().all() and unknown.link_source.isna().all()


@pytest.mark.slow
def test_each_row_says_how_it_ran_loader_device_and_backend(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,), repeats=2)
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    for frame in (tables.runs, tables.repeats):
        assert (frame.loader == "dali").all() and (frame.device == "cpu").all() and (frame.backend == "gloo").all()
        assert (frame.profile_kind == "measured").all() and (frame.profile_device == "cpu").all()
    plan_path = tmp_path / "plans" / "synthetic1k" / "vgg11" / "n2-1gbit.json"
    modelled = {**json.loads(plan_path.read_text()), "profile_kind": "modelled", "profile_device": "v100"}
    plan_path.write_text(json.dumps(modelled))
    runs_table = build_tables(load_records(runs, [tmp_path / "plans"])).runs
    assert list(runs_table.profile_kind) == ["modelled"] and list(runs_table.profile_device) == ["v100"]
    doc = json.loads((runs[1] / "metrics.json").read_text())
    (runs[1] / "metrics.json").write_text(json.dumps({**doc, "device": "cuda:0", "backend": "nccl"}))
    with pytest.raises(ConfigError, match="disagree on device \\(cpu, cuda:0\\)"):
        build_tables(load_records(runs, [tmp_path / "plans"]))
