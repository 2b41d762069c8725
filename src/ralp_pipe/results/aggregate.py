"""`ralp-pipe aggregate`: training records -> runs.parquet, speedups.parquet, summary.md and plots.

The tables are pure functions of the raw records (each run's :class:`~ralp_pipe.results.records.RunMetrics`
and the :class:`~ralp_pipe.results.records.Plan` it was planned with), so :mod:`ralp_pipe.results.verify`
can recompute them from a bundle and compare. File names come from :mod:`ralp_pipe.results.layout`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from ralp_pipe.atomic import atomic_path
from ralp_pipe.config import STRATEGIES, ConfigError
from ralp_pipe.engine.volume import CATEGORIES
from ralp_pipe.errors import DataError
from ralp_pipe.results.accuracy import median_abs_error, relative_error
from ralp_pipe.results.layout import (
    CONCURRENT_TABLE,
    METRICS_FILE,
    PLAN_FILE,
    PLOTS_FOLDER,
    RUNS_TABLE,
    SPEEDUPS_TABLE,
    SUMMARY_FILE,
)
from ralp_pipe.results.records import Plan, RunMetrics

GROUP = ["model", "dataset", "gpus", "network"]
CONCURRENT_COLUMNS = ["workload", "job", "overrides", "alone_images_per_sec", "together_images_per_sec", "slowdown"]
Records = Sequence[tuple[RunMetrics, Plan | None]]


@dataclass
class Tables:
    """The aggregated results of one experiment."""

    runs: pd.DataFrame
    speedups: pd.DataFrame
    concurrent: pd.DataFrame
    summary: str


def find_metrics(paths: Iterable[str | Path]) -> list[Path]:
    """Run records (metrics.json) named directly, inside the given run folders, or anywhere below given folders."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif (path / METRICS_FILE).is_file():
            found.append(path / METRICS_FILE)
        elif path.is_dir():
            found += sorted(path.rglob(METRICS_FILE))
        else:
            raise ConfigError(f"run record {path} does not exist: run the train stage first")
    if not found:
        raise ConfigError(f"no {METRICS_FILE} under {', '.join(map(str, paths))}")
    return found


def plan_for(record: RunMetrics, plans: Path) -> Plan | None:
    """The plan the run's (model, dataset, N, network) was planned with, if its file exists below `plans`."""
    path = plans / PLAN_FILE.format(
        dataset=record.dataset, model=record.model, gpus=record.gpus, network=record.network
    )
    return Plan.read(path) if path.is_file() else None


def _gb(values: dict[str, Any] | None, category: str) -> float:
    value = (values or {}).get(category)
    return math.nan if value is None else float(value)


def run_row(record: RunMetrics, plan: Plan | None) -> dict[str, Any]:
    """One row of runs.parquet from a run's record and its plan."""
    row = {key: getattr(record, key) for key in RunMetrics.columns()}
    row["classes"] = record.num_classes
    row["run"] = record.run
    for category in ("total", *CATEGORIES):
        row[f"gb_{category}"] = _gb(record.gb_per_step, category)
        row[f"analytic_gb_{category}"] = _gb(record.analytic_gb_per_step, category)
    wire = record.wire_gb_per_step
    row["wire_gb_total"] = math.nan if wire is None else float(wire)
    predicted = (plan.strategies if plan is not None else {}).get(record.strategy) or {}
    row["predicted_images_per_sec"] = float(predicted.get("predicted_images_per_sec", math.nan) or math.nan)
    volume = predicted.get("predicted_gb_per_step")
    row["predicted_gb_per_step"] = _gb(volume, "total") if isinstance(volume, dict) else float(volume or math.nan)
    row["hardware"] = json.dumps(record.hardware, sort_keys=True)
    row["split"] = -1 if record.split is None else int(record.split)
    return row


def runs_table(records: Records) -> pd.DataFrame:
    """runs.parquet: one row per run, sorted, with its speedup over `ps` in the same group."""
    frame = pd.DataFrame([run_row(record, plan) for record, plan in records])
    order = {name: i for i, name in enumerate(STRATEGIES)}
    frame = frame.sort_values(GROUP + ["strategy"], key=lambda col: col.map(order) if col.name == "strategy" else col)
    frame = frame.reset_index(drop=True)
    duplicated = frame[frame.duplicated(GROUP + ["strategy"])]
    if not duplicated.empty:
        raise ConfigError(f"several records of the same run: {', '.join(duplicated['run'])}")
    baseline = frame[frame["strategy"] == "ps"].set_index(GROUP)["images_per_sec"]
    keys = pd.MultiIndex.from_frame(frame[GROUP])
    frame["speedup_vs_ps"] = frame["images_per_sec"].to_numpy() / baseline.reindex(keys).to_numpy()
    frame["prediction_error"] = relative_error(frame["predicted_images_per_sec"], frame["images_per_sec"])
    return frame


def speedups_table(runs: pd.DataFrame) -> pd.DataFrame:
    """speedups.parquet: throughput of each strategy next to `ps`'s and their ratio."""
    columns = GROUP + ["strategy", "images_per_sec", "speedup_vs_ps"]
    frame = runs[columns].rename(columns={"speedup_vs_ps": "speedup"})
    frame.insert(len(GROUP) + 2, "ps_images_per_sec", frame["images_per_sec"] / frame["speedup"])
    return frame.reset_index(drop=True)


def _fmt(value: float, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}{suffix}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def concurrent_table(workloads: Sequence[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """concurrent.parquet: each job of each concurrent workload, alone and together, and its slowdown."""
    rows = [
        {
            "workload": name,
            "job": int(job["job"]),
            "overrides": " ".join(job["overrides"]),
            "alone_images_per_sec": float(job["alone_images_per_sec"]),
            "together_images_per_sec": float(job["together_images_per_sec"]),
            "slowdown": float(job["slowdown"]),
        }
        for name, doc in workloads
        for job in doc["jobs"]
    ]
    frame = pd.DataFrame(rows, columns=CONCURRENT_COLUMNS)
    return frame.sort_values(["workload", "job"]).reset_index(drop=True)


def concurrent_markdown(concurrent: pd.DataFrame) -> str:
    """The summary's section on concurrent workloads ('' when there are none)."""
    if concurrent.empty:
        return ""
    rows = [
        [
            r.workload,
            str(r.job),
            f"`{r.overrides}`",
            _fmt(r.alone_images_per_sec),
            _fmt(r.together_images_per_sec),
            _fmt(r.slowdown, 2, "x"),
        ]
        for r in concurrent.itertuples()
    ]
    header = ["workload", "job", "overrides", "alone (img/s)", "together (img/s)", "slowdown"]
    return "\n".join(["## Concurrent workloads on one network", "", _markdown(header, rows), ""])


def summary_markdown(runs: pd.DataFrame) -> str:
    """summary.md: the paper's tables (throughput and speedup per strategy, GB/step, prediction error)."""
    present = [s for s in STRATEGIES if s in set(runs["strategy"])]
    others = [s for s in present if s != "ps"]
    parts = [
        "# Results",
        "",
        f"{len(runs)} runs; throughput in images/sec (all workers), "
        "speedup = throughput / throughput of `ps` at the same model, dataset, N and network.",
        "",
    ]
    for network, by_net in runs.groupby("network", sort=True):
        rate = by_net["rate"].iloc[0]
        rows_tp, rows_gb, rows_pred = [], [], []
        for (model, dataset, gpus), group in by_net.groupby(["model", "dataset", "gpus"], sort=True):
            cells = group.set_index("strategy")
            head = [model, dataset, str(int(cells["classes"].iloc[0])), str(gpus)]
            rows_tp.append(
                head
                + [_fmt(cells["images_per_sec"].get(s, math.nan)) for s in present]
                + [_fmt(cells["speedup_vs_ps"].get(s, math.nan), 2, "x") for s in others]
            )
            rows_gb.append(head + [_fmt(cells["gb_total"].get(s, math.nan), 4) for s in present])
            rows_pred.append(
                head
                + [
                    f"{_fmt(cells['predicted_images_per_sec'].get(s, math.nan))} "
                    f"({_fmt(100 * cells['prediction_error'].get(s, math.nan), 0, '%')})"
                    for s in present
                ]
            )
        head = ["model", "dataset", "classes", "N"]
        errors = by_net["prediction_error"].dropna()
        accuracy = (
            f"Median absolute error of predicted images/sec: {_fmt(100 * median_abs_error(errors), 1, '%')} "
            f"over {len(errors)} runs with a plan."
        )
        parts += [
            f"## Network {network} ({rate})",
            "",
            "### Throughput (images/sec) and speedup over ps",
            "",
            _markdown(head + present + [f"{s} speedup" for s in others], rows_tp),
            "",
            "### Transfer volume (GB/step, all categories)",
            "",
            _markdown(head + present, rows_gb),
            "",
            "### Predicted throughput (images/sec) and its error against the measurement",
            "",
            _markdown(head + present, rows_pred),
            "",
            accuracy,
            "",
        ]
    return "\n".join(parts)


def build_tables(records: Records, workloads: Sequence[tuple[str, dict[str, Any]]] = ()) -> Tables:
    """All tables of an experiment from (run record, plan) pairs and (name, concurrent.json) pairs."""
    runs = runs_table(records)
    concurrent = concurrent_table(workloads)
    summary = summary_markdown(runs) + concurrent_markdown(concurrent)
    return Tables(runs=runs, speedups=speedups_table(runs), concurrent=concurrent, summary=summary)


def load_workloads(paths: Iterable[str | Path]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name = its folder's name, concurrent.json) of each concurrent result file."""
    return [(Path(path).parent.name, _read_json(Path(path))) for path in paths]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read concurrent result {path}: {exc}; re-run `ralp-pipe concurrent`") from exc


def load_records(run_paths: Iterable[str | Path], plans: Path) -> list[tuple[RunMetrics, Plan | None]]:
    """(run record, plan) pairs of every run found under `run_paths`."""
    return [(record, plan_for(record, plans)) for record in map(RunMetrics.read, find_metrics(run_paths))]


def write_tables(tables: Tables, out: Path) -> None:
    """Write the tables (runs, speedups, concurrent, summary) into `out` atomically."""
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in (
        (RUNS_TABLE, tables.runs),
        (SPEEDUPS_TABLE, tables.speedups),
        (CONCURRENT_TABLE, tables.concurrent),
    ):
        with atomic_path(out / name) as tmp:
            frame.to_parquet(tmp, index=False)
    with atomic_path(out / SUMMARY_FILE) as tmp:
        tmp.write_text(tables.summary)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe aggregate`."""
    parser.add_argument(
        "--runs", nargs="+", required=True, help="run folders, metrics.json files or folders above them"
    )
    parser.add_argument(
        "--plans", type=Path, required=True, help="plans folder (plans/<dataset>/<model>/n<N>-<net>.json)"
    )
    parser.add_argument("--concurrent", nargs="*", default=[], help="concurrent.json files of concurrent workloads")
    parser.add_argument("--out", type=Path, required=True, help="tables folder to write")


def main(args: argparse.Namespace) -> int:
    """Aggregate the given runs into tables and plots."""
    from ralp_pipe.results.plots import write_plots

    tables = build_tables(load_records(args.runs, args.plans), load_workloads(args.concurrent))
    write_tables(tables, args.out)
    write_plots(tables.runs, args.out / PLOTS_FOLDER)
    print(f"aggregate: {len(tables.runs)} runs -> {args.out}")
    return 0
