"""`ralp-pipe compare A B`: changes joined by configuration, told apart from noise, and the exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from conftest import Ran
from ralp_pipe.cli import main as cli
from ralp_pipe.results.aggregate import build_tables, load_records, write_tables
from ralp_pipe.results.compare import REGRESSED, WITHIN, compare, read_runs
from workflow_records import write_results


def _aggregate(root: Path) -> Path:
    """Tables (no plots: compare reads runs.parquet) of the records below `root`."""
    shutil.rmtree(root / "tables", ignore_errors=True)
    write_tables(build_tables(load_records([root / "runs"], [root / "plans"])), root / "tables", plots=False)
    return root


def _results(root: Path, repeats: int = 3, **results: Any) -> Path:
    write_results(root, models=("vgg11",), gpus=(2,), repeats=repeats, **results)
    return _aggregate(root)


def _scale(root: Path, strategy: str, factor: float) -> None:
    """Multiply images/sec of every repeat of one strategy by `factor` and aggregate again."""
    for path in (root / "runs").rglob("metrics.json"):
        if path.parent.parent.name == strategy:
            doc = json.loads(path.read_text())
            doc["images_per_sec"] *= factor
            path.write_text(json.dumps(doc))
    _aggregate(root)


def _set_split(root: Path, strategy: str, split: int) -> None:
    """Give every repeat of one RALP strategy another split point and aggregate again."""
    for path in (root / "runs").rglob("metrics.json"):
        if path.parent.parent.name == strategy:
            doc = json.loads(path.read_text())
            doc["split"] = split
            path.write_text(json.dumps(doc))
    _aggregate(root)


@pytest.mark.slow
def test_a_configuration_placed_differently_is_joined_and_its_two_splits_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _results(tmp_path / "a"), _results(tmp_path / "b")
    _set_split(b, "ralp_n", 6)
    assert cli(["compare", str(a), str(b)]) == 0  # a placement change is reported, not a regression
    out = capsys.readouterr().out
    [ralp_n] = [line for line in out.splitlines() if "| ralp_n |" in line]
    assert ralp_n.endswith("| within noise | layer4.0 (8) -> 6 |"), ralp_n
    [ralp_h] = [line for line in out.splitlines() if "| ralp_h |" in line]
    assert ralp_h.endswith("| within noise | same |"), ralp_h
    assert "1 configuration ran with another split in B" in out


@pytest.mark.slow
def test_identical_input_reports_no_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _results(tmp_path / "a")
    assert cli(["compare", str(root), str(root / "tables")]) == 0
    out = capsys.readouterr().out
    assert "| vgg11 | synthetic1k | 2 | 1gbit | ralp_n | 240.0 ± 16.0 (k=3) | 240.0 ± 16.0 (k=3) | +0.0 ± " in out
    assert "4 within noise" in out and REGRESSED not in out


@pytest.mark.slow
def test_a_regression_beyond_noise_exits_1_and_a_change_within_noise_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Repeats spread ±5% (half-width 6.7% of each mean with 3 repeats, the spread pooled over 4 configurations:
    8 degrees of freedom): -30% is beyond noise; -6.5% is outside B's interval (140.25 ± 9.3) but inside A's
    (150 ± 10.0), so not beyond the noise of both."""
    a, b = _results(tmp_path / "a"), _results(tmp_path / "b")
    _scale(b, "ralp_n", 0.70)
    _scale(b, "allreduce", 0.935)
    assert cli(["compare", str(a), str(b)]) == 1
    verdicts = compare(read_runs(a), read_runs(b)).table.set_index("strategy")["verdict"]
    assert verdicts["ralp_n"] == REGRESSED and verdicts["allreduce"] == WITHIN and verdicts["ps"] == WITHIN
    assert "1 REGRESSION" in capsys.readouterr().out
    assert cli(["compare", str(b), str(a)]) == 0  # the other way round it is an improvement


@pytest.mark.slow
def test_one_repeat_gives_no_interval_and_no_verdict(tmp_path: Path) -> None:
    a, b = _results(tmp_path / "a", repeats=1), _results(tmp_path / "b", repeats=1)
    _scale(b, "ralp_n", 0.5)
    assert cli(["compare", str(a), str(b)]) == 0
    assert set(compare(read_runs(a), read_runs(b)).table["verdict"]) == {"no interval (1 repeat)"}


@pytest.mark.slow
def test_configurations_in_one_side_only_are_listed(tmp_path: Path) -> None:
    a = _results(tmp_path / "a")
    b = _results(tmp_path / "b", sequential=("ps",))
    table = compare(read_runs(a), read_runs(b)).table.set_index("strategy")
    assert table.loc["ps-sequential", "verdict"] == "only in B" and len(table) == 5


@pytest.mark.slow
def test_a_bundle_compares_with_its_results_folder(tmp_path: Path) -> None:
    root = _results(tmp_path / "a")
    bundle = tmp_path / "a.tar.gz"
    includes = [str(root / name) for name in ("runs", "plans", "tables")]  # the plans the tables were made with
    assert cli(["bundle", "--root", str(root), "--include", *includes, "--out", str(bundle)]) == 0
    assert cli(["compare", str(bundle), str(root)]) == 0


def test_unusable_inputs_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert f"{tmp_path} is neither a bundle nor a folder" in capsys.readouterr().err
    old = _results(tmp_path / "old")
    runs = pd.read_parquet(old / "tables" / "runs.parquet").drop(columns=["images_per_sec_std"])
    runs.to_parquet(old / "tables" / "runs.parquet")
    assert cli(["compare", str(old), str(old)]) == 3
    assert "lacks column images_per_sec_std: it predates repeats" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("column", "value"), [("repeats", float("nan")), ("repeats", 0), ("images_per_sec", None)])
def test_a_runs_table_with_an_unusable_value_is_a_one_line_data_error(
    tmp_path: Path, column: str, value: Any, ralp_pipe: Callable[..., Ran]
) -> None:
    a, b = _results(tmp_path / "a"), _results(tmp_path / "b")
    table = b / "tables" / "runs.parquet"
    frame = pd.read_parquet(table)
    frame[column] = frame[column].astype("float64")
    frame.loc[frame["strategy"] == "ralp_n", column] = value
    frame.to_parquet(table)
    proc = ralp_pipe("compare", str(a), str(b))
    assert proc.returncode == 3, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"ralp-pipe compare: data error: runs table of {table}: the row model=vgg11, ") and (
        "strategy=ralp_n has repeats=" in line and "the table is damaged" in line
    ), line
