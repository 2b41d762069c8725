"""`ralp-pipe aggregate`: training records -> runs.parquet, repeats.parquet, speedups.parquet, summary.md and plots.

The tables are pure functions of the raw records (each run's :class:`~ralp_pipe.results.records.RunMetrics`,
its steps.parquet and the :class:`~ralp_pipe.results.records.Plan` it was planned with), so
:mod:`ralp_pipe.results.verify` can recompute them from a bundle and compare. File names come from
:mod:`ralp_pipe.results.layout`.

``repeats.parquet`` has one row per run (one repeat of a configuration); ``runs.parquet`` one row per
configuration (model, dataset, N, network, strategy), its figures the mean over the repeats with the
standard deviation and a 95% t-interval of images/sec (:mod:`ralp_pipe.results.intervals`); speedups
are ratios of means with delta-method intervals. In both tables ``strategy`` is the row's name: the
strategy, or ``<strategy>-sequential`` for the sequential ablation (``strategy.overlap=false``, column
``overlap``); speedups are over the pipelined ``ps`` and over ``allreduce`` of the same group.
Missing values are nulls (NaN for numbers).

Aggregate reads exactly the runs and plans it is named: a named run without its metrics.json is
refused, never left out, and each run gets the plan that records its dataset, model, N and network.
Its outputs (tables, summary.md, plots) are replaced all together or not at all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from ralp_pipe.atomic import Writer, check_writable, write_together
from ralp_pipe.config import STRATEGIES, ConfigError
from ralp_pipe.engine.metrics import link_rate
from ralp_pipe.engine.volume import CATEGORIES
from ralp_pipe.errors import DataError, disk_error
from ralp_pipe.results.accuracy import median_abs_error, relative_error
from ralp_pipe.results.breakdown import breakdown_markdown, breakdown_table
from ralp_pipe.results.intervals import LEVEL, Estimate, mean_interval, ratio_interval
from ralp_pipe.results.layout import (
    BREAKDOWN_TABLE,
    CONCURRENT_TABLE,
    METRICS_FILE,
    PLOTS_FOLDER,
    REPEATS_TABLE,
    RUNS_TABLE,
    SPEEDUPS_TABLE,
    STEPS_FILE,
    SUMMARY_FILE,
    arm,
)
from ralp_pipe.results.records import Plan, RunMetrics

GROUP = ["model", "dataset", "gpus", "network"]  # strategies are compared within a group
CONFIGURATION = GROUP + ["strategy"]  # what repeats share (strategy: the row name, see the module docstring)
BASELINES = ("ps", "allreduce")  # speedup_vs_<baseline> of every row
SPEEDUP_METHOD = "delta"  # how speedup intervals are computed (ralp_pipe.results.intervals.ratio_interval)
# Settings every repeat of a configuration must share (else the records mix two experiments).
SHARED = ["classes", "rate", "link_gbit", "link_source", "workers", "num_ps", "devices", "batch_size",
          "global_batch", "image_size", "warmup_steps", "measure_steps", "images_per_step", "split", "device",
          "backend", "loader", "profile_kind", "profile_device", "dilation_factor", "dilation_mode", "target_device",
          "target_link_rate"]  # fmt: skip
MEANS = ["step_time_s", "step_p50_s", "step_p95_s", "wire_gb_total"]
CONCURRENT_COLUMNS = ["workload", "job", "overrides", "alone_images_per_sec", "together_images_per_sec", "slowdown"]
STEP_QUANTILES = {"step_p50_s": 0.5, "step_p95_s": 0.95}  # of the per-step times within a run
MEASURED, WORKER = "measure", "worker"  # steps.parquet's phase of measured steps and role of workers
PlanKey = tuple[str, str, int, str]  # (dataset, model, N, network): what one plan is for


@dataclass(frozen=True)
class RunInput:
    """What aggregation reads of one run: its record, its plan (if any) and its steps.parquet."""

    record: RunMetrics
    plan: Plan | None
    steps: pd.DataFrame


Records = Sequence[RunInput]


@dataclass
class Tables:
    """The aggregated results of one experiment."""

    runs: pd.DataFrame
    repeats: pd.DataFrame
    speedups: pd.DataFrame
    concurrent: pd.DataFrame
    breakdown: pd.DataFrame  # one row per run (results.breakdown)
    summary: str

    def frames(self) -> dict[str, pd.DataFrame]:
        """The Parquet tables by file name."""
        return {
            RUNS_TABLE: self.runs,
            REPEATS_TABLE: self.repeats,
            SPEEDUPS_TABLE: self.speedups,
            CONCURRENT_TABLE: self.concurrent,
            BREAKDOWN_TABLE: self.breakdown,
        }


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


def _gb(values: dict[str, Any] | None, category: str) -> float:
    value = (values or {}).get(category)
    return math.nan if value is None else float(value)


def split_unit(record: RunMetrics, plan: Plan | None) -> str | None:
    """The name of the unit the run's split follows, from its plan's split table (None without split or plan)."""
    entry = (plan.strategies if plan is not None else {}).get(record.strategy) or {}
    if record.split is None:
        return None
    if entry.get("split") == record.split and entry.get("split_after_unit"):
        return str(entry["split_after_unit"])
    return next((str(row["after_unit"]) for row in entry.get("table", []) if row.get("split") == record.split), None)


def step_quantiles(steps: pd.DataFrame) -> dict[str, float]:
    """p50 and p95 of a run's measured step times: a step lasts as long as its slowest worker's."""
    measured = steps[(steps["phase"] == MEASURED) & (steps["role"] == WORKER)]
    per_step = measured.groupby("step")["step_time_s"].max()
    return {name: float(per_step.quantile(q)) if len(per_step) else math.nan for name, q in STEP_QUANTILES.items()}


def run_row(run: RunInput) -> dict[str, Any]:
    """One row of repeats.parquet from a run's record, steps and plan."""
    record, plan = run.record, run.plan
    row = {key: getattr(record, key) for key in RunMetrics.columns()}
    row["strategy"] = record.arm
    row["overlap"] = record.overlap
    row["repeat"] = record.repeat
    row["classes"] = record.num_classes
    row["run"] = record.run
    row["devices"] = record.world_size or record.workers + record.num_ps
    row["link_gbit"], row["link_source"] = link_rate(record.rate, record.cluster_kind, plan)
    row["images_per_sec_per_device"] = record.images_per_sec / row["devices"]
    row.update(step_quantiles(run.steps))
    for category in ("total", *CATEGORIES):
        row[f"gb_{category}"] = _gb(record.gb_per_step, category)
        row[f"analytic_gb_{category}"] = _gb(record.analytic_gb_per_step, category)
    wire = record.wire_gb_per_step
    row["wire_gb_total"] = math.nan if wire is None else float(wire)
    # The plan prices the experiment's own schedule, not the sequential ablation's.
    planned = plan.strategies if plan is not None and record.overlap else {}
    predicted = planned.get(record.strategy) or {}
    row["predicted_images_per_sec"] = float(predicted.get("predicted_images_per_sec", math.nan) or math.nan)
    volume = predicted.get("predicted_gb_per_step")
    row["predicted_gb_per_step"] = _gb(volume, "total") if isinstance(volume, dict) else float(volume or math.nan)
    row["hardware"] = json.dumps(record.hardware, sort_keys=True)
    row["split_unit"] = split_unit(record, plan)
    # what the prediction priced: a profile measured on this device, or modelled for a target GPU
    row["profile_kind"] = None if plan is None else plan.profile_kind
    row["profile_device"] = None if plan is None else plan.profile_device
    row.update(dilation_columns(record))
    return row


def dilation_columns(record: RunMetrics) -> dict[str, Any]:
    """A run's time-dilated emulation (engine/dilation.py): factor, mode, target device and link rate, overruns,
    and its target-equivalent images/sec (measured x factor); nulls and 0 overruns for an undilated run."""
    d = record.dilation or {}
    target = record.target_images_per_sec
    return {
        "dilation_factor": float(d.get("factor") or math.nan),
        "dilation_mode": d.get("mode"),
        "target_device": d.get("target_device"),
        "target_link_rate": d.get("target_link_rate"),
        "overruns": int(d.get("overruns", 0)),
        "late_s": float(d.get("late_s", 0.0)),  # lateness against the target left at a measured step's end
        "target_images_per_sec": math.nan if target is None else float(target),
    }


def _order(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows sorted by `keys`, strategies in STRATEGIES order with each sequential ablation after its strategy."""
    rank = {arm(s, overlap): 2 * i + (not overlap) for i, s in enumerate(STRATEGIES) for overlap in (True, False)}
    ordered = frame.sort_values(keys, key=lambda col: col.map(rank) if col.name == "strategy" else col)
    return ordered.reset_index(drop=True)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with nullable integer and string types where a column may be null (split, names of things)."""
    strings = ["split_unit", "link_source", "device", "backend", "loader", "profile_kind", "profile_device"]
    strings += ["dilation_mode", "target_device", "target_link_rate"]
    floats = ["link_gbit", "dilation_factor", "target_images_per_sec"]
    return frame.astype({"split": "Int64", **dict.fromkeys(floats, "float64"), **dict.fromkeys(strings, "string")})


def repeats_table(runs: Records) -> pd.DataFrame:
    """repeats.parquet: one row per run, sorted by configuration and repeat; a run recorded twice is refused."""
    frame = pd.DataFrame([run_row(run) for run in runs])
    frame = _typed(frame)
    frame = _order(frame, CONFIGURATION + ["repeat"])
    duplicated = frame[frame.duplicated(CONFIGURATION + ["repeat"])]
    if not duplicated.empty:
        raise ConfigError(f"several records of the same run: {', '.join(duplicated['run'])}")
    return frame


def _estimate(values: pd.Series) -> Estimate:
    return mean_interval([float(v) for v in values])


def _configuration_row(repeats: pd.DataFrame) -> dict[str, Any]:
    """The row of one configuration: its shared settings and the mean (with interval) over its repeats."""
    first = repeats.iloc[0]
    for column in SHARED:
        if repeats[column].nunique(dropna=False) > 1:
            raise ConfigError(
                f"the repeats of {first['run'].rsplit('/', 1)[0]} disagree on {column} "
                f"({', '.join(map(str, repeats[column].unique()))}): aggregate the runs of one experiment"
            )
    row = {key: first[key] for key in CONFIGURATION + ["overlap", *SHARED, "split_unit"]}
    row["run"] = first["run"].rsplit("/", 1)[0]
    row["repeats"] = len(repeats)
    throughput = _estimate(repeats["images_per_sec"])
    row.update(
        images_per_sec=throughput.mean,
        images_per_sec_std=throughput.std,
        images_per_sec_ci_low=throughput.low,
        images_per_sec_ci_high=throughput.high,
    )
    # target-equivalent: each repeat's measured figure x its D (dilation.factor=auto may choose another per repeat)
    target = _estimate(repeats["target_images_per_sec"]) if repeats["dilation_factor"].notna().all() else None
    row.update(
        target_images_per_sec=math.nan if target is None else target.mean,
        target_images_per_sec_ci_low=math.nan if target is None else target.low,
        target_images_per_sec_ci_high=math.nan if target is None else target.high,
        overruns=int(repeats["overruns"].sum()),
        late_s=float(repeats["late_s"].max()),
    )
    per_device = _estimate(repeats["images_per_sec_per_device"])
    row.update(
        images_per_sec_per_device=per_device.mean,
        images_per_sec_per_device_ci_low=per_device.low,
        images_per_sec_per_device_ci_high=per_device.high,
    )
    gb = [c for c in repeats.columns if c.startswith(("gb_", "analytic_gb_"))]
    for column in MEANS + gb + ["predicted_images_per_sec", "predicted_gb_per_step"]:
        row[column] = float(repeats[column].mean())
    row["hardware"], row["git_revision"] = first["hardware"], first["git_revision"]
    return row


def runs_table(repeats: pd.DataFrame) -> pd.DataFrame:
    """runs.parquet: one row per configuration, with speedups over `ps` and `allreduce` in the same group."""
    groups = repeats.groupby(CONFIGURATION, sort=False, dropna=False)
    frame = _typed(_order(pd.DataFrame([_configuration_row(group) for _, group in groups]), CONFIGURATION))
    estimates = {key: _estimate(group["images_per_sec"]) for key, group in groups}
    for baseline in BASELINES:
        cells = []
        for key in frame[CONFIGURATION].itertuples(index=False, name=None):
            base = estimates.get((*key[:-1], baseline))
            if base is None:
                cells.append(Estimate(math.nan, math.nan, 0, math.nan))
            elif key[-1] == baseline:  # the same repeats on both sides: exactly 1
                cells.append(Estimate(1.0, 0.0, base.count, 0.0))
            else:
                cells.append(ratio_interval(estimates[key], base))
        frame[f"speedup_vs_{baseline}"] = [e.mean for e in cells]
        frame[f"speedup_vs_{baseline}_ci_low"] = [e.low for e in cells]
        frame[f"speedup_vs_{baseline}_ci_high"] = [e.high for e in cells]
    frame["prediction_error"] = relative_error(frame["predicted_images_per_sec"], frame["images_per_sec"])
    return frame


def speedups_table(runs: pd.DataFrame) -> pd.DataFrame:
    """speedups.parquet: throughput of each configuration next to each baseline's, their ratio and its interval."""
    frame = runs[CONFIGURATION + ["repeats", "images_per_sec", "dilation_factor", "overruns", "late_s"]].copy()
    for baseline in BASELINES:
        ratio = runs[f"speedup_vs_{baseline}"]
        frame[f"{baseline}_images_per_sec"] = runs["images_per_sec"] / ratio
        frame[f"speedup_vs_{baseline}"] = ratio
        frame[f"speedup_vs_{baseline}_ci_low"] = runs[f"speedup_vs_{baseline}_ci_low"]
        frame[f"speedup_vs_{baseline}_ci_high"] = runs[f"speedup_vs_{baseline}_ci_high"]
    frame["interval_method"] = SPEEDUP_METHOD
    return frame.reset_index(drop=True)


def _fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{value:.{digits}f}{suffix}"


def _pm(mean: float, low: float, high: float, digits: int = 1, suffix: str = "") -> str:
    """`mean ± half-width` (just the mean where there is no interval)."""
    if math.isnan(low) or math.isnan(high) or low == high:
        return _fmt(mean, digits, suffix)
    return f"{_fmt(mean, digits)} ± {_fmt((high - low) / 2, digits)}{suffix}"


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


def _split_cell(row: Any) -> str:
    """The split as the unit it follows and its index, e.g. ``layer3.0 (6)``; '-' without one."""
    if row.split is pd.NA or row.split is None:
        return "-"
    return f"{row.split_unit} ({row.split})" if isinstance(row.split_unit, str) else str(row.split)


def _link_cell(runs: pd.DataFrame) -> str:
    """A network's link as its rows record it, e.g. ``0.97 Gbit/s probed`` (its rate where neither shaped nor probed)."""
    links = runs[["link_gbit", "link_source", "rate"]].drop_duplicates()
    return "; ".join(
        rate if pd.isna(source) else f"{gbit:.3g} Gbit/s {source}"
        for gbit, source, rate in links.itertuples(index=False)
    )


def _speedup_cell(row: Any, baseline: str) -> str:
    name = f"speedup_vs_{baseline}"
    return _pm(getattr(row, name), getattr(row, f"{name}_ci_low"), getattr(row, f"{name}_ci_high"), 2, "x")


def _target_cell(row: Any) -> str:
    """A dilated configuration's target-equivalent images/sec, naming what it emulates; '-' where undilated."""
    if math.isnan(row.dilation_factor):
        return "-"
    figure = _pm(row.target_images_per_sec, row.target_images_per_sec_ci_low, row.target_images_per_sec_ci_high)
    flag = f"; {row.overruns} overruns, up to {1e3 * row.late_s:.0f} ms late at a step's end" if row.overruns else ""
    return (
        f"{figure} (dilated emulation of {row.target_device} on {row.target_link_rate}, "
        f"D={row.dilation_factor:g}{flag})"
    )


def _prediction_cell(predicted: float, error: float) -> str:
    return "-" if math.isnan(predicted) else f"{_fmt(predicted)} ({_fmt(100 * error, 0, '%')})"


def summary_markdown(runs: pd.DataFrame) -> str:
    """summary.md: per network, throughput with intervals and speedups, then volume and predictions, one row per configuration."""
    repeats = sorted(set(runs["repeats"]))
    parts = [
        "# Results",
        "",
        f"{len(runs)} configurations, {int(runs['repeats'].sum())} runs "
        f"({' or '.join(map(str, repeats))} repeat{'s' * (repeats != [1])} each). Figures are means over the repeats "
        f"± the half-width of a {LEVEL:.0%} t-interval (no ± with one repeat). Throughput is "
        "images/sec of all workers; per device divides it by the devices the strategy runs "
        "(workers plus parameter servers or the PS device). The per-worker batch is the same for "
        "every strategy, so the global batch is workers x batch and differs between strategies. "
        "Step p50/p95: median and 95th percentile of the measured steps within a run (mean over repeats). "
        f"Speedups are ratios of mean throughput over `ps` (pipelined) and over `allreduce` at the same "
        f"model, dataset, N and network, with {LEVEL:.0%} delta-method intervals. `-sequential` rows are the "
        "ablation without push/pull overlap (strategy.overlap=false). Split: the unit the lower part ends "
        "with and its index. Each network's heading gives its link: the tc rate the emulated cluster shapes "
        "every host link to, or the payload rate the link probe measured.",
        "",
    ]
    dilated = bool(runs["dilation_factor"].notna().any())
    if dilated:
        parts[-2] += (
            " Target-equivalent images/sec (time-dilated emulation, D = the dilation factor): the measured "
            "images/sec x D, with its interval, where every unit was padded to D x the target device's time and "
            "links ran at their rate / D; GB/step, splits and speedups are those of the target. A run whose "
            "units outlasted their padded time has overruns, named in its cell: there the target's timing was "
            "not reproduced."
        )
    head = ["model", "dataset", "classes", "N", "strategy", "devices", "global batch"]
    for network, by_net in runs.groupby("network", sort=True):
        rows_tp, rows_gb = [], []
        for r in by_net.itertuples():
            cells = [r.model, r.dataset, str(r.classes), str(r.gpus), r.strategy, str(r.devices), str(r.global_batch)]
            rows_tp.append(
                cells
                + [
                    _split_cell(r),
                    str(r.repeats),
                    _pm(r.images_per_sec, r.images_per_sec_ci_low, r.images_per_sec_ci_high),
                    _pm(
                        r.images_per_sec_per_device,
                        r.images_per_sec_per_device_ci_low,
                        r.images_per_sec_per_device_ci_high,
                        2,
                    ),
                    f"{_fmt(r.step_p50_s, 3)} / {_fmt(r.step_p95_s, 3)}",
                    *(_speedup_cell(r, baseline) for baseline in BASELINES),
                    *([_target_cell(r)] if dilated else []),
                ]
            )
            rows_gb.append(
                cells
                + [
                    _fmt(r.gb_total, 4),
                    _fmt(r.wire_gb_total, 4),
                    _prediction_cell(r.predicted_images_per_sec, r.prediction_error),
                ]
            )
        errors = by_net["prediction_error"].dropna()
        accuracy = (
            f"Median absolute error of predicted images/sec: {_fmt(100 * median_abs_error(errors), 1, '%')} "
            f"over {len(errors)} configurations with a prediction."
        )
        tp_head = ["split", "repeats", "images/sec", "per device", "step p50 / p95 (s)", "vs ps", "vs allreduce"]
        tp_head += ["target-equivalent images/sec"] if dilated else []
        parts += [
            f"## Network {network} ({_link_cell(by_net)})",
            "",
            "### Throughput (images/sec) and speedups",
            "",
            _markdown(head + tp_head, rows_tp),
            "",
            "### Transfer volume (GB/step) and predicted throughput (images/sec, error against the measurement)",
            "",
            _markdown(head + ["GB/step", "wire GB/step", "predicted"], rows_gb),
            "",
            accuracy,
            "",
        ]
    return "\n".join(parts) + "\n"  # a blank line before the sections that follow


def build_tables(records: Records, workloads: Sequence[tuple[str, dict[str, Any]]] = ()) -> Tables:
    """All tables of an experiment from its runs' inputs and (name, concurrent.json) pairs."""
    repeats = repeats_table(records)
    runs = runs_table(repeats)
    concurrent = concurrent_table(workloads)
    breakdown = _order(breakdown_table((run.record, run.steps) for run in records), CONFIGURATION + ["repeat"])
    summary = summary_markdown(runs) + breakdown_markdown(breakdown) + concurrent_markdown(concurrent)
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
    parser.add_argument("--out", type=Path, required=True, help="tables folder to write")


def main(args: argparse.Namespace) -> int:
    """Aggregate the given runs into tables and plots."""
    check_writable(args.out, f"--out {args.out}")
    tables = build_tables(load_records(args.runs, args.plans), load_workloads(args.concurrent))
    write_tables(tables, args.out)
    print(f"aggregate: {len(tables.repeats)} runs of {len(tables.runs)} configurations -> {args.out}")
    return 0
