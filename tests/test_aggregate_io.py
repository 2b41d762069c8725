"""What aggregate reads and writes: exactly the runs and plans it is named, never one left out, and its
outputs replaced all together or not at all."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.contract.layout import PLOT_NAMES, PLOTS_FOLDER, TABLE_FILES
from ralp_pipe.errors import ConfigError, DataError
from ralp_pipe.results import plots
from ralp_pipe.results.aggregate import load_records
from workflow_helpers import snakemake
from workflow_records import write_results


def aggregate(root: Path, runs: list[Path], *plans: Path) -> int:
    """`ralp-pipe aggregate` of `runs` with `plans` (default: the plans folder below `root`) into root/tables."""
    plan_args = [str(p) for p in plans] or [str(root / "plans")]
    return cli(["aggregate", "--runs", *map(str, runs), "--plans", *plan_args, "--out", str(root / "tables")])


def set_aside(run: Path) -> None:
    """What an interrupted rerun of `run` leaves: its earlier records moved into .previous/, none current."""
    (run / ".previous").mkdir()
    for name in ("metrics.json", "steps.parquet"):
        os.replace(run / name, run / ".previous" / f"{name}.old")


def test_a_named_run_without_records_is_refused_by_name_not_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,), repeats=2)
    set_aside(runs[3])
    assert aggregate(tmp_path, runs) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ralp-pipe aggregate: data error: run folder {runs[3]} holds no metrics.json")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "tables" / "repeats.parquet").exists()
    # a folder of run folders: every run folder below it must hold its records too
    with pytest.raises(DataError, match=f"run folder {runs[3]} holds no metrics.json"):
        load_records([tmp_path / "runs"], [tmp_path / "plans"])


@pytest.mark.slow
def test_plans_are_named_as_files_and_joined_by_what_each_was_made_for(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2, 4))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plans = []
    for n in (2, 4):  # plan files under names that follow no layout
        plans.append(elsewhere / f"plan-{6 - n}.json")
        os.replace(tmp_path / "plans" / "synthetic1k" / "vgg11" / f"n{n}-1gbit.json", plans[-1])
    assert aggregate(tmp_path, runs, *plans) == 0
    table = pd.read_parquet(tmp_path / "tables" / "runs.parquet")
    assert table.predicted_images_per_sec.notna().all()
    at = table.set_index(["gpus", "strategy"])
    for n in (2, 4):  # each N has its own plan: its own predictions
        assert at.loc[(n, "ps"), "predicted_images_per_sec"] == pytest.approx(
            json.loads(plans[n // 2 - 1].read_text())["strategies"]["ps"]["predicted_images_per_sec"]
        )


def test_two_plans_for_one_configuration_or_a_plan_that_does_not_say_are_refused(tmp_path: Path) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,))
    plan = tmp_path / "plans" / "synthetic1k" / "vgg11" / "n2-1gbit.json"
    copy = tmp_path / "copy.json"
    copy.write_text(plan.read_text())
    with pytest.raises(ConfigError, match=f"plans {plan} and {copy} are both for synthetic1k/vgg11/2/1gbit"):
        load_records(runs, [plan, copy])
    doc = json.loads(plan.read_text())
    del doc["network"]
    plan.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=f"plan {plan} lacks key 'network'"):
        load_records(runs, [plan])


@pytest.mark.slow  # a snakemake dry-run subprocess
def test_the_workflow_names_every_run_and_plan_of_the_matrix_to_aggregate(tmp_path: Path) -> None:
    result = snakemake(tmp_path, "--dry-run", "--printshellcmds", "--cores", "1", config={"experiment": "smoke"})
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "ralp-pipe aggregate" in x)
    args = shlex.split(line.split("ralp-pipe aggregate", 1)[1].split(">")[0])
    runs, plans = args[args.index("--runs") + 1 : args.index("--plans")], args[args.index("--plans") + 1 :]
    plans = plans[: plans.index("--concurrent")]
    trained = {x.split("--out ", 1)[1].split()[0] for x in result.stdout.splitlines() if "ralp-pipe train" in x}
    planned = {x.split("--out ", 1)[1].split()[0] for x in result.stdout.splitlines() if "ralp-pipe plan" in x}
    assert set(runs) == trained and len(runs) == len(trained) == 4
    assert set(plans) == planned and all(plan.endswith(".json") for plan in plans)


def outputs(tables: Path) -> dict[str, bytes]:
    """Every file aggregate writes, by its path below the tables folder."""
    names = [*TABLE_FILES, *(f"{PLOTS_FOLDER}/{name}.png" for name in PLOT_NAMES)]
    return {name: (tables / name).read_bytes() for name in names}


@pytest.mark.slow  # aggregates twice and draws the plots (seconds)
@pytest.mark.parametrize("failure", ["read-only plots folder", "a plot that fails half-way"])
def test_a_failed_aggregate_leaves_the_previous_outputs_all_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, failure: str
) -> None:
    runs = write_results(tmp_path, models=("vgg11",), gpus=(2,))
    assert aggregate(tmp_path, runs) == 0
    before = outputs(tmp_path / "tables")
    runs += write_results(tmp_path, models=("vgg11",), gpus=(4,))  # twice the configurations
    folder = tmp_path / "tables" / PLOTS_FOLDER
    if failure == "read-only plots folder":  # as the kernel answers a non-root writer (the tests may run as root)
        make = tempfile.mkstemp

        def mkstemp(*args: object, dir: str | os.PathLike[str] | None = None, **kwargs: object) -> tuple[int, str]:
            if dir is not None and Path(dir) == folder:
                raise PermissionError(13, "Permission denied", str(folder))
            return make(*args, dir=dir, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    else:

        def full(tables: object, path: Path) -> None:
            raise OSError(28, "No space left on device", str(path))

        monkeypatch.setitem(plots.PLOTS, "speedup", full)
    full = failure == "a plot that fails half-way"  # a full disk is unusable data (3), an unwritable folder a setting
    assert aggregate(tmp_path, runs) == (3 if full else 2)
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"ralp-pipe aggregate: data error: cannot write the tables in {tmp_path / 'tables'}: "
        if full
        else f"ralp-pipe aggregate: configuration error: --out {tmp_path / 'tables'}: cannot write"
    ), err
    assert "left as they were" in err and len(err.splitlines()) == 1
    assert outputs(tmp_path / "tables") == before
    leftovers = [p for p in (tmp_path / "tables").rglob("*") if p.name.startswith(".")]
    assert leftovers == []
    monkeypatch.undo()
    assert aggregate(tmp_path, runs) == 0
    assert len(pd.read_parquet(tmp_path / "tables" / "runs.parquet")) == 8


def test_a_folder_where_an_output_belongs_is_refused_before_anything_is_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = write_results(tmp_path, models=("vgg11",), strategies=("ps",), gpus=(2,))
    (tmp_path / "tables" / "summary.md").mkdir(parents=True)
    assert aggregate(tmp_path, runs) == 2
    assert "summary.md" in capsys.readouterr().err
    assert not (tmp_path / "tables" / "runs.parquet").exists()
