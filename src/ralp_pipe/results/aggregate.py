"""`ralp-pipe aggregate`: training records -> runs.parquet, repeats.parquet, speedups.parquet, summary.md and plots.

The tables (:mod:`ralp_pipe.results.tables`) and summary.md (:mod:`ralp_pipe.results.summary`) are pure
functions of the raw records (each run's :class:`~ralp_pipe.contract.records.RunMetrics`, its
steps.parquet and the :class:`~ralp_pipe.contract.records.Plan` it was planned with), so
:mod:`ralp_pipe.results.verify` can recompute them from a bundle and compare. File names come from
:mod:`ralp_pipe.contract.layout`.

Aggregate reads exactly the runs and plans it is named: a named run without its metrics.json is
refused, never left out, and each run gets the plan that records its dataset, model, N and network.
Its outputs (tables, summary.md, plots) are replaced all together or not at all.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from ralp_pipe.atomic import Writer, check_writable, write_together
from ralp_pipe.config import ConfigError
from ralp_pipe.contract.layout import (
    METRICS_FILE,
    PLOTS_FOLDER,
    STEPS_FILE,
    SUMMARY_FILE,
)
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.errors import DataError, disk_error
from ralp_pipe.results.breakdown import breakdown_markdown, breakdown_table
from ralp_pipe.results.fidelity import PlanKey, fidelity_markdown
from ralp_pipe.results.summary import concurrent_markdown, summary_markdown
from ralp_pipe.results.tables import (
    CONFIGURATION,
    Records,
    RunInput,
    Tables,
    concurrent_table,
    order,
    repeats_table,
    runs_table,
    speedups_table,
)


def find_metrics(paths: Iterable[str | Path]) -> list[Path]:
    """Run records: metrics.json files named directly, run folders, or folders of run folders.

    Every run folder named, and every run folder below a folder named (each folder without
    subfolders, hidden ones aside), must hold its metrics.json: a run without one (unfinished,
    failed, or an interrupted rerun's records set aside in `.previous/`) is refused by name, never
    left out of the tables.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += _records_below(path)
        else:
            raise ConfigError(f"run record {path} does not exist: run the train stage first")
    if not found:
        raise ConfigError(f"no {METRICS_FILE} under {', '.join(map(str, paths))}")
    return found


def _records_below(folder: Path) -> list[Path]:
    """The metrics.json of `folder` if it holds one, else of every run folder below it; a run folder without one raises."""
    found = []
    for top, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        if METRICS_FILE in files:
            found.append(Path(top, METRICS_FILE))
            folders.clear()
        elif not folders:
            raise DataError(
                f"run folder {top} holds no {METRICS_FILE} (the run did not finish, or a rerun was interrupted): "
                f"re-run `ralp-pipe train --out {top}` or leave the run out"
            )
    return found


def plan_key(plan: Plan, path: Path) -> PlanKey:
    """The (dataset, model, N, network) plan `path` records it was made for; a plan that does not say is refused."""
    key = (plan.dataset, plan.model, plan.gpus, plan.network)
    missing = [name for name, value in zip(("dataset", "model", "gpus", "network"), key) if value is None]
    if missing:
        raise DataError(f"plan {path} lacks key {', '.join(map(repr, missing))}: re-run `ralp-pipe plan`")
    return key  # type: ignore[return-value]


def load_plans(paths: Iterable[str | Path]) -> dict[PlanKey, Plan]:
    """The plans named (JSON files, or folders of them), by what each was made for; two for one run are refused."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.rglob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"plan {path} does not exist: run the plan stage first")
    plans: dict[PlanKey, Plan] = {}
    where: dict[PlanKey, Path] = {}
    for path in files:
        plan = Plan.read(path)
        key = plan_key(plan, path)
        if key in plans:
            raise ConfigError(f"plans {where[key]} and {path} are both for {'/'.join(map(str, key))}: name one")
        plans[key], where[key] = plan, path
    return plans


def read_steps(path: Path) -> pd.DataFrame:
    """A run's steps.parquet (one row per rank and step), refused by name when unreadable or incomplete."""
    try:
        steps = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read step records {path}: {exc}; re-run `ralp-pipe train`") from exc
    missing = [c for c in ("role", "step", "phase", "step_time_s") if c not in steps.columns]
    if missing:
        raise DataError(f"step records {path} lack column {', '.join(missing)}: re-run `ralp-pipe train`")
    return steps


def build_tables(
    records: Records,
    workloads: Sequence[tuple[str, dict[str, Any]]] = (),
    measured: Mapping[PlanKey, Plan] | None = None,
) -> Tables:
    """All tables of an experiment from its runs' inputs, (name, concurrent.json) pairs and the plans made from
    profiles measured here (experiment.measured_profiles), by what each was made for."""
    repeats = repeats_table(records)
    runs = runs_table(repeats)
    concurrent = concurrent_table(workloads)
    breakdown = order(breakdown_table((run.record, run.steps) for run in records), CONFIGURATION + ["repeat"])
    used = {
        (run.record.dataset, run.record.model, run.record.gpus, run.record.network): run.plan
        for run in records
        if run.plan is not None
    }
    summary = summary_markdown(runs) + fidelity_markdown(runs, measured or {}, used)
    summary += breakdown_markdown(breakdown) + concurrent_markdown(concurrent)
    speedups = speedups_table(runs)
    return Tables(runs, repeats, speedups, concurrent, breakdown, summary)


def load_workloads(paths: Iterable[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name = its folder's name, concurrent.json) of each concurrent result file."""
    return [(Path(path).parent.name, _read_json(Path(path))) for path in paths]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read concurrent result {path}: {exc}; re-run `ralp-pipe concurrent`") from exc


def load_records(run_paths: Iterable[str | Path], plan_paths: Iterable[str | Path]) -> list[RunInput]:
    """Record, plan and steps of every run named (see :func:`find_metrics`; steps.parquet next to each metrics.json),
    each with the plan among `plan_paths` made for its dataset, model, N and network (None where there is none)."""
    plans = load_plans(plan_paths)
    found = [(RunMetrics.read(path), path.parent / STEPS_FILE) for path in find_metrics(run_paths)]
    return [
        RunInput(record, plans.get((record.dataset, record.model, record.gpus, record.network)), read_steps(steps))
        for record, steps in found
    ]


def _parquet(frame: pd.DataFrame) -> Writer:
    return lambda path: frame.to_parquet(path, index=False)


def write_tables(tables: Tables, out: Path, plots: bool = True) -> list[Path]:
    """Write the tables, summary.md and (with `plots`) every plot into `out`, replacing all of them together.

    Each file is written under a temporary name beside its target, every one made before the first
    is written, and renamed only once all are: a folder that cannot be written, a full disk or a
    failing plot leaves the previous set as it was. Returns the files.
    """
    writers: dict[Path, Writer] = {out / name: _parquet(frame) for name, frame in tables.frames().items()}
    writers[out / SUMMARY_FILE] = lambda path: path.write_text(tables.summary)
    if plots:
        from ralp_pipe.results.plots import plot_writers  # matplotlib: only where plots are drawn

        writers.update(plot_writers(tables, out / PLOTS_FOLDER))
    try:
        return write_together(writers)
    except OSError as exc:
        advice = "the previous tables and plots are left as they were: free space there (or choose another --out)"
        full = disk_error(exc, f"the tables in {out}", out, advice)
        if full is not None:
            raise full from exc
        raise ConfigError(
            f"--out {out}: cannot write the tables there ({exc}); the previous tables and plots are left as they "
            f"were: fix that path or choose another --out"
        ) from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe aggregate`."""
    parser.add_argument(
        "--runs",
        nargs="+",
        required=True,
        help="run folders (each must hold metrics.json), metrics.json files, or folders of run folders",
    )
    parser.add_argument(
        "--plans",
        nargs="+",
        required=True,
        help="plan files (or folders of them); each run gets the one made for its dataset, model, N and network",
    )
    parser.add_argument("--concurrent", nargs="*", default=[], help="concurrent.json files of concurrent workloads")
    parser.add_argument(
        "--measured-plans",
        nargs="*",
        default=[],
        help="plans made from profiles measured here (experiment.measured_profiles), shown beside the runs' plans",
    )
    parser.add_argument("--out", type=Path, required=True, help="tables folder to write")


def main(args: argparse.Namespace) -> int:
    """Aggregate the given runs into tables and plots."""
    check_writable(args.out, f"--out {args.out}")
    measured = load_plans(args.measured_plans)
    tables = build_tables(load_records(args.runs, args.plans), load_workloads(args.concurrent), measured)
    write_tables(tables, args.out)
    print(f"aggregate: {len(tables.repeats)} runs of {len(tables.runs)} configurations -> {args.out}")
    return 0
