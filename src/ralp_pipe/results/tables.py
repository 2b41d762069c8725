"""The tables of an experiment, pure functions of the raw records: repeats, runs, speedups and concurrent jobs.

Each run's :class:`~ralp_pipe.contract.records.RunMetrics`, its steps.parquet and the
:class:`~ralp_pipe.contract.records.Plan` it was planned with (a :class:`RunInput`) give one row of
``repeats.parquet``; ``runs.parquet`` has one row per configuration (model, dataset, N, network,
strategy), its figures the mean over the repeats with the standard deviation and a 95% t-interval of
images/sec (:mod:`ralp_pipe.results.intervals`); speedups are ratios of means with delta-method
intervals, of target-equivalent images/sec where a configuration was dilated (``dilation.factor=auto``
may choose another D per strategy, so measured figures are not comparable), measured ones where not
(:func:`comparable`). In both tables ``strategy`` is the row's name: the strategy, or
``<strategy>-sequential`` for the sequential ablation (``strategy.overlap=false``, column ``overlap``); speedups are over the
pipelined ``ps`` and over ``allreduce`` of the same group. Missing values are nulls (NaN for numbers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from ralp_pipe.config import STRATEGIES, ConfigError
from ralp_pipe.contract.layout import BREAKDOWN_TABLE, CONCURRENT_TABLE, REPEATS_TABLE, RUNS_TABLE, SPEEDUPS_TABLE, arm
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.engine.metrics import link_rate
from ralp_pipe.engine.volume import CATEGORIES
from ralp_pipe.results.accuracy import relative_error
from ralp_pipe.results.intervals import Estimate, mean_interval, ratio_interval

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
    stalls, lateness and its target-equivalent images/sec (measured x factor); nulls and 0s for an undilated run."""
    d = record.dilation or {}
    target = record.target_images_per_sec
    return {
        "dilation_factor": record.dilation_factor,
        "dilation_mode": d.get("mode"),
        "target_device": d.get("target_device"),
        "target_link_rate": d.get("target_link_rate"),
        "overruns": int(d.get("overruns", 0)),
        "stalls": int(d.get("stalls", 0)),  # units late only because this host ran another thread
        "late_s": float(d.get("late_s", 0.0)),  # lateness against the target left at a measured step's end
        "target_images_per_sec": math.nan if target is None else float(target),
    }


def order(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
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
    frame = order(frame, CONFIGURATION + ["repeat"])
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
        stalls=int(repeats["stalls"].sum()),
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
    frame = _typed(order(pd.DataFrame([_configuration_row(group) for _, group in groups]), CONFIGURATION))
    estimates = {key: _estimate(_target_where_dilated(group, "images_per_sec")) for key, group in groups}
    for baseline in BASELINES:
        ratios = []
        for key in frame[CONFIGURATION].itertuples(index=False, name=None):
            base = estimates.get((*key[:-1], baseline))
            if base is None:
                ratios.append(Estimate(math.nan, math.nan, 0, math.nan))
            elif key[-1] == baseline:  # the same repeats on both sides: exactly 1
                ratios.append(Estimate(1.0, 0.0, base.count, 0.0))
            else:
                ratios.append(ratio_interval(estimates[key], base))
        frame[f"speedup_vs_{baseline}"] = [e.mean for e in ratios]
        frame[f"speedup_vs_{baseline}_ci_low"] = [e.low for e in ratios]
        frame[f"speedup_vs_{baseline}_ci_high"] = [e.high for e in ratios]
    frame["prediction_error"] = relative_error(frame["predicted_images_per_sec"], comparable(frame)["images_per_sec"])
    return frame


def _target_where_dilated(frame: pd.DataFrame, column: str) -> pd.Series:
    """`column` of each row (a repeat or a configuration) as compared: its ``target_`` twin where dilated."""
    return frame[f"target_{column}"].where(frame["dilation_factor"].notna(), frame[column])


def comparable(runs: pd.DataFrame) -> pd.DataFrame:
    """`images_per_sec` and its interval as the planner predicts them: target-equivalent where a configuration was
    dilated (its plan priced the target's devices and link), measured where not."""
    columns = ["images_per_sec", "images_per_sec_ci_low", "images_per_sec_ci_high"]
    return pd.DataFrame({c: _target_where_dilated(runs, c) for c in columns}, index=runs.index)


def speedups_table(runs: pd.DataFrame) -> pd.DataFrame:
    """speedups.parquet: throughput of each configuration next to each baseline's, their ratio and its interval
    (images/sec as compared: target-equivalent where dilated, :func:`comparable`)."""
    frame = runs[CONFIGURATION + ["repeats", "dilation_factor", "overruns", "late_s"]].copy()
    frame.insert(len(CONFIGURATION) + 1, "images_per_sec", comparable(runs)["images_per_sec"])
    for baseline in BASELINES:
        ratio = runs[f"speedup_vs_{baseline}"]
        frame[f"{baseline}_images_per_sec"] = frame["images_per_sec"] / ratio
        frame[f"speedup_vs_{baseline}"] = ratio
        frame[f"speedup_vs_{baseline}_ci_low"] = runs[f"speedup_vs_{baseline}_ci_low"]
        frame[f"speedup_vs_{baseline}_ci_high"] = runs[f"speedup_vs_{baseline}_ci_high"]
    frame["interval_method"] = SPEEDUP_METHOD
    return frame.reset_index(drop=True)


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
