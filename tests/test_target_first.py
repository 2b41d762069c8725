"""What a reader sees first is the target's figure: in every table, summary.md section and plot of a time-dilated
experiment the first throughput column is the target-equivalent images/sec (the emulator's wall clock x D), the
emulator's own figure later and named so; concurrent workloads give target-equivalent figures and slowdowns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from ralp_pipe.errors import DataError
from ralp_pipe.results import plots
from ralp_pipe.results.aggregate import build_tables, load_records, load_workloads
from ralp_pipe.results.compare import WITHIN, compare, target_first
from ralp_pipe.results.tables import BASELINES, Tables, concurrent_table
from workflow_records import dilate, write_concurrent, write_results

FACTOR = 8.0


def _dilated(root: Path, factors: dict[str, float] | None = None) -> Tables:
    """The tables of vgg11 at N=2, 3 repeats, every run dilated by FACTOR (or its strategy's of `factors`), and a
    concurrent workload dilated by FACTOR."""
    runs = write_results(root, models=("vgg11",), gpus=(2,), repeats=3)
    for run in runs:
        dilate(run, (factors or {}).get(run.parent.name, FACTOR), overruns=0)
    workloads = load_workloads([write_concurrent(root, factor=FACTOR)])
    return build_tables(load_records(runs, [root / "plans"]), workloads)


def _wall_clock(root: Path) -> dict[str, float]:
    """Each run's recorded (wall-clock) images/sec by its run name."""
    paths = (root / "runs").rglob("metrics.json")
    return {str(p.parent.relative_to(root / "runs")): json.loads(p.read_text())["images_per_sec"] for p in paths}


def _throughput_columns(frame: pd.DataFrame) -> list[str]:
    baselines = tuple(f"{b}_" for b in BASELINES)  # speedups.parquet's figures of each baseline
    return [c for c in frame.columns if c.endswith("images_per_sec") and not c.startswith(("predicted", *baselines))]


@pytest.mark.slow
def test_every_table_leads_with_the_target_equivalent_figure_and_names_the_emulator_s_later(tmp_path: Path) -> None:
    tables = _dilated(tmp_path)
    measured = _wall_clock(tmp_path)
    for name, frame in (("runs", tables.runs), ("repeats", tables.repeats), ("speedups", tables.speedups)):
        columns = _throughput_columns(frame)
        assert columns == ["images_per_sec", "emulator_images_per_sec"], (name, columns)
        assert "target_images_per_sec" not in frame.columns, name
    repeats = tables.repeats
    assert list(repeats["emulator_images_per_sec"]) == [measured[run] for run in repeats["run"]]
    assert list(repeats["images_per_sec"]) == pytest.approx([FACTOR * measured[run] for run in repeats["run"]])
    runs = tables.runs.set_index("strategy")
    for strategy, row in runs.iterrows():
        wall = [measured[run] for run in repeats[repeats["strategy"] == strategy]["run"]]
        assert row.emulator_images_per_sec == pytest.approx(sum(wall) / len(wall))
        assert row.images_per_sec == pytest.approx(FACTOR * row.emulator_images_per_sec)
        assert row.images_per_sec_own_std == pytest.approx(FACTOR * pd.Series(wall).std())
        # the pooled spread is relative: the target's and the emulator's intervals are the same share of their means
        relative = (row.images_per_sec_ci_high - row.images_per_sec) / row.images_per_sec
        emulator = (row.emulator_images_per_sec_ci_high - row.emulator_images_per_sec) / row.emulator_images_per_sec
        assert relative == pytest.approx(emulator)
        assert row.images_per_sec_per_device == pytest.approx(row.images_per_sec / row.devices)
        assert row.prediction_error == pytest.approx(row.predicted_images_per_sec / row.images_per_sec - 1)
    speedups = tables.speedups.set_index("strategy")
    assert list(speedups["images_per_sec"]) == pytest.approx(list(runs["images_per_sec"]))
    assert list(speedups["emulator_images_per_sec"]) == pytest.approx(list(runs["emulator_images_per_sec"]))


def _table_of(summary: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first Markdown table after `heading` in summary.md."""
    lines = summary.splitlines()
    start = lines.index(heading)
    table = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
        elif table:
            break
    return table[0], table[2:]


@pytest.mark.slow
def test_summary_md_shows_the_target_s_images_per_sec_and_step_times_first_the_emulator_s_last(
    tmp_path: Path,
) -> None:
    tables = _dilated(tmp_path)
    header, rows = _table_of(tables.summary, "### Throughput (images/sec) and speedups")
    assert header.index("target-equivalent images/sec") < header.index("vs ps") < len(header) - 1
    assert header[-1] == "emulator images/sec (wall clock)" and "images/sec" not in header
    by_strategy = {row[header.index("strategy")]: dict(zip(header, row)) for row in rows}
    for strategy, run in tables.runs.set_index("strategy").iterrows():
        cells = by_strategy[str(strategy)]
        half = (run.images_per_sec_ci_high - run.images_per_sec_ci_low) / 2
        assert cells["target-equivalent images/sec"] == f"{run.images_per_sec:.1f} ± {half:.1f}"
        emulator = cells["emulator images/sec (wall clock)"]
        assert emulator.startswith(f"{run.emulator_images_per_sec:.1f} ± ") and f"D={FACTOR:g})" in emulator
        p50, p95 = (float(v) for v in cells["step p50 / p95 (s)"].split(" / "))
        assert p50 == pytest.approx(run.step_p50_s / FACTOR, abs=5e-4)
        assert p95 == pytest.approx(run.step_p95_s / FACTOR, abs=5e-4)


@pytest.mark.slow
def test_concurrent_jobs_give_target_equivalent_figures_and_slowdowns_from_them(tmp_path: Path) -> None:
    """write_concurrent's jobs ran 100 img/s alone and 50 and 60 together on the emulator, at D = FACTOR."""
    tables = _dilated(tmp_path)
    concurrent = tables.concurrent
    assert _throughput_columns(concurrent)[:2] == ["alone_images_per_sec", "together_images_per_sec"]
    assert list(concurrent["alone_images_per_sec"]) == [100.0 * FACTOR] * 2
    assert list(concurrent["together_images_per_sec"]) == [50.0 * FACTOR, 60.0 * FACTOR]
    assert list(concurrent["slowdown"]) == pytest.approx([2.0, 100 / 60])
    assert list(concurrent["dilation_factor"]) == [FACTOR] * 2
    assert list(concurrent["together_emulator_images_per_sec"]) == [50.0, 60.0]
    header, rows = _table_of(tables.summary, "## Concurrent workloads on one network")
    assert header[4:7] == ["alone (target-equivalent img/s)", "together (target-equivalent img/s)", "slowdown"]
    assert header[-1] == "emulator alone / together (img/s, wall clock)"
    assert rows[1][4:] == ["800.0", "480.0", "1.67x", "100.0 / 60.0 (D=8)"]


def test_undilated_concurrent_jobs_keep_their_measured_figures(tmp_path: Path) -> None:
    frame = concurrent_table(load_workloads([write_concurrent(tmp_path)]))
    assert list(frame["together_images_per_sec"]) == list(frame["together_emulator_images_per_sec"]) == [50.0, 60.0]
    assert frame["dilation_factor"].isna().all()


def test_a_concurrent_result_without_its_dilation_factor_is_refused_by_name(tmp_path: Path) -> None:
    path = write_concurrent(tmp_path)
    doc = json.loads(path.read_text())
    del doc["jobs"][1]["dilation_factor"]
    with pytest.raises(DataError, match=r"concurrent workload w0: job 1 .*re-run `ralp-pipe concurrent`"):
        concurrent_table([("w0", doc)])


@pytest.mark.slow
def test_compare_sets_target_figures_side_by_side_across_factors_and_table_versions(tmp_path: Path) -> None:
    """B ran every strategy at half A's D and measured twice A's images/sec: the same target, no change. An older
    runs table (images_per_sec the emulator's, the target's in target_images_per_sec) is read target-first."""
    a = _dilated(tmp_path / "a").runs
    b_root = tmp_path / "b"
    runs = write_results(b_root, models=("vgg11",), gpus=(2,), repeats=3)
    for run in runs:
        doc = json.loads((run / "metrics.json").read_text())
        doc["images_per_sec"] *= 2
        doc["window_s"] /= 2
        doc["step_time_s"] /= 2
        (run / "metrics.json").write_text(json.dumps(doc))
        dilate(run, FACTOR / 2, overruns=0)
    b = build_tables(load_records(runs, [b_root / "plans"])).runs
    assert list(b["emulator_images_per_sec"]) == pytest.approx(list(2 * a["emulator_images_per_sec"]))
    older = _older_table(a)
    half_widths = ((a["images_per_sec_ci_high"] - a["images_per_sec_ci_low"]) / 2).set_axis(a["strategy"])
    for pair in ((a, b), (target_first(older), b)):
        result = compare(*pair).table
        assert list(result["change"]) == pytest.approx([0.0] * 4, abs=1e-12)
        assert set(result["verdict"]) == {WITHIN}
        widths = result.set_index("strategy")["half_width_a"]
        assert dict(widths) == pytest.approx(dict(half_widths))


def _older_table(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` as aggregation wrote it before the target's figure came first."""
    older = runs.drop(columns=[c for c in runs.columns if c.startswith("emulator_")])
    older["target_images_per_sec"] = runs["images_per_sec"]
    for end in ("ci_low", "ci_high"):
        older[f"target_images_per_sec_{end}"] = runs[f"images_per_sec_{end}"]
        older[f"images_per_sec_{end}"] = runs[f"emulator_images_per_sec_{end}"]
    older["images_per_sec"] = runs["emulator_images_per_sec"]
    older["images_per_sec_std"] = runs["images_per_sec_std"] / runs["dilation_factor"]
    return older


@pytest.mark.slow
def test_throughput_plots_name_their_axes_target_equivalent_where_dilated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    dilated = _dilated(tmp_path / "dilated")
    undilated = build_tables(
        load_records(write_results(tmp_path / "plain", models=("vgg11",), gpus=(2,)), [tmp_path / "plain" / "plans"])
    )
    for tables in (dilated, undilated):
        plots.throughput_vs_n(tables, Path("unused.png"))
        plots.predicted_vs_measured(tables, Path("unused.png"))
    labels = [(f.axes[0].get_ylabel(), f.axes[0].get_xlabel()) for f in figures]
    assert labels[0][0] == "target-equivalent images/sec (all workers)"
    assert labels[1][1] == "measured target-equivalent images/sec (95% interval)"
    assert labels[2][0] == "images/sec (all workers)" and labels[3][1] == "measured images/sec (95% interval)"
    [points] = [c for c in figures[0].axes[0].containers if c.get_label() == "ps @ 1gbit"]
    assert list(points.lines[0].get_ydata()) == pytest.approx(
        [dilated.runs.set_index("strategy").loc["ps", "images_per_sec"]]
    )
    plt.close("all")
