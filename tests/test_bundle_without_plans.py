"""A bundle verifies wherever its runs aggregated: runs aggregated without plans (their prediction columns
empty) make a bundle without a plans folder, and verify recomputes the same tables from what it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from conftest import Ran
from workflow_records import write_results


@pytest.mark.slow  # aggregates and verifies 4 runs, drawing the plots twice (~10 s)
def test_runs_aggregated_with_an_empty_plans_folder_bundle_and_verify(
    ralp_pipe: Callable[..., Ran], tmp_path: Path
) -> None:
    root = tmp_path / "results"
    write_results(root, models=("vgg11",), gpus=(2,))
    empty = root / "no-plans"
    empty.mkdir()
    aggregated = ralp_pipe(
        "aggregate", "--runs", str(root / "runs"), "--plans", str(empty), "--out", str(root / "tables")
    )
    assert aggregated.returncode == 0, aggregated.stderr
    runs = pd.read_parquet(root / "tables" / "runs.parquet")
    assert len(runs) == 4 and runs.filter(like="predicted").isna().all().all()
    bundle = root / "bundles" / "noplans.tar.gz"
    include = [str(root / "runs"), str(root / "tables")]
    bundled = ralp_pipe("bundle", "--root", str(root), "--include", *include, "--out", str(bundle))
    assert bundled.returncode == 0, bundled.stderr
    verified = ralp_pipe("verify", str(bundle))
    assert verified.returncode == 0, verified.stderr
    assert ", 4 runs, tables recomputed" in verified.stdout, verified.stdout
