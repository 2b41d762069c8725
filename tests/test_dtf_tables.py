"""RALP's speedup over `dtf` beside those over `ps` and `allreduce`: in runs.parquet, speedups.parquet, summary.md and
the plots, wherever `dtf` ran (and nowhere else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ralp_pipe.config import STRATEGY_KINDS
from ralp_pipe.results import plots
from ralp_pipe.results.aggregate import build_tables, load_records
from ralp_pipe.results.tables import BASELINES, Tables, baselines_present
from test_plots import drawn
from workflow_records import PAPER_FOUR, images_per_sec, write_results

WITH_DTF = (*PAPER_FOUR, "dtf")


def _tables(root: Path, strategies: tuple[str, ...], networks: tuple[str, ...] = ("1gbit",)) -> Tables:
    runs = write_results(root, models=("vgg11",), strategies=strategies, gpus=(4,), networks=networks, repeats=2)
    return build_tables(load_records(runs, [root / "plans"]))


def test_baselines_are_the_strategy_tables_parameter_servers_first() -> None:
    assert BASELINES == ("ps", "dtf", "byteps", "allreduce")
    assert set(BASELINES) == {name for name, kind in STRATEGY_KINDS.items() if kind.baseline}


@pytest.mark.slow
def test_runs_and_speedups_hold_the_speedup_over_dtf(tmp_path: Path) -> None:
    tables = _tables(tmp_path, WITH_DTF)
    runs = tables.runs.set_index("strategy")
    want = images_per_sec("vgg11", "1gbit", "ralp_n", 4) / images_per_sec("vgg11", "1gbit", "dtf", 4)
    assert runs.loc["ralp_n", "speedup_vs_dtf"] == pytest.approx(want)
    assert runs.loc["dtf", "speedup_vs_dtf"] == 1.0
    low, high = runs["speedup_vs_dtf_ci_low"].to_dict(), runs["speedup_vs_dtf_ci_high"].to_dict()
    assert low["ralp_n"] < want < high["ralp_n"]
    speedups = tables.speedups.set_index("strategy")
    assert speedups.loc["ralp_n", "dtf_images_per_sec"] == pytest.approx(runs.loc["dtf", "images_per_sec"])
    assert baselines_present(tables.runs) == ["ps", "dtf", "allreduce"]
    header = next(line for line in tables.summary.splitlines() if line.startswith("| model") and "vs ps" in line)
    assert header.rstrip().endswith("| vs ps | vs dtf | vs allreduce |")
    assert "over `ps`, over `dtf` and over `allreduce`" in tables.summary


@pytest.mark.slow
def test_without_dtf_the_summary_has_no_dtf_column(tmp_path: Path) -> None:
    tables = _tables(tmp_path, PAPER_FOUR)
    assert tables.runs["speedup_vs_dtf"].isna().all()
    assert "vs dtf" not in tables.summary and "vs allreduce" in tables.summary


@pytest.mark.slow
def test_the_plots_draw_a_panel_over_each_baseline_that_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _tables(tmp_path, WITH_DTF, networks=("100mbit", "1gbit"))
    bars = drawn(monkeypatch, plots.speedup, tables)
    assert [a.get_ylabel() for a in bars.axes] == ["speedup over ps", "speedup over dtf", "speedup over allreduce"]
    headline = drawn(monkeypatch, plots.speedup_vs_link, tables)
    titles = [a.get_title() for a in headline.axes]
    dtf_ps = int(tables.runs.loc[tables.runs["strategy"] == "dtf", "num_ps"].iloc[0])
    assert titles == [
        "over ps (1 PS rank at N=4)",
        f"over dtf ({dtf_ps} PS ranks at N=4, one per worker host)",
        "over allreduce",
    ]
    over_dtf = headline.axes[1]
    line = next(x for x in over_dtf.get_lines() if x.get_label() == "vgg11/synthetic1k N=4 ralp_n predicted")
    predicted = tables.runs.set_index(["strategy", "network"])["predicted_images_per_sec"].to_dict()
    want = [predicted[("ralp_n", n)] / predicted[("dtf", n)] for n in ("100mbit", "1gbit")]
    assert list(line.get_ydata()) == pytest.approx(want)
