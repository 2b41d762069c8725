"""The tables of an experiment, pure functions of the raw records: repeats, runs, speedups and concurrent jobs.

Each run's :class:`~ralp_pipe.contract.records.RunMetrics`, its steps.parquet and the
:class:`~ralp_pipe.contract.records.Plan` it was planned with (a :class:`RunInput`) give one row of
``repeats.parquet``; ``runs.parquet`` has one row per configuration (model, dataset, N, network,
strategy), its figures the mean over the repeats with the standard deviation and a 95% t-interval of
images/sec (:mod:`ralp_pipe.results.intervals`); speedups are ratios of means with delta-method intervals.

Every table's first throughput column, ``images_per_sec``, is the target's: for a time-dilated run
(:mod:`ralp_pipe.engine.dilation`, factor D) its target-equivalent images/sec, the measured figure x D; for
an undilated run (D = 1) the measured figure itself. The emulator's own wall-clock images/sec follows in
``emulator_images_per_sec`` (:func:`throughput`). Speedups, predictions and plots compare the first:
``dilation.factor=auto`` may choose another D per strategy, so wall-clock figures are not comparable.
In both tables ``strategy`` is the row's name: the strategy, or
``<strategy>-sequential`` for the sequential ablation (``strategy.overlap=false``, column ``overlap``); speedups are over the
pipelined ``ps`` and over ``allreduce`` of the same group. Missing values are nulls (NaN for numbers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from ralp_pipe.config import STRATEGIES, ConfigError, baselines
from ralp_pipe.contract.layout import BREAKDOWN_TABLE, CONCURRENT_TABLE, REPEATS_TABLE, RUNS_TABLE, SPEEDUPS_TABLE, arm
from ralp_pipe.contract.records import Plan, RunMetrics
from ralp_pipe.engine.metrics import link_rate, target_equivalent
from ralp_pipe.engine.volume import CATEGORIES
from ralp_pipe.errors import DataError
from ralp_pipe.results.accuracy import relative_error
from ralp_pipe.results.intervals import Estimate, Pool, mean_interval, pool, pooled_interval, ratio_interval

GROUP = ["model", "dataset", "gpus", "network"]  # strategies are compared within a group
CONFIGURATION = GROUP + ["strategy"]  # what repeats share (strategy: the row name, see the module docstring)
# speedup_vs_<baseline> of every row: the strategy table's baselines, its parameter servers first
BASELINES = tuple(baselines())
SPEEDUP_METHOD = "delta"  # how speedup intervals are computed (ralp_pipe.results.intervals.ratio_interval)
# Settings every repeat of a configuration must share (else the records mix two experiments).
SHARED = ["classes", "rate", "link_gbit", "link_source", "workers", "num_ps", "devices", "batch_size",
          "global_batch", "image_size", "warmup_steps", "measure_steps", "images_per_step", "split", "device",
          "backend", "loader", "profile_kind", "profile_device", "dilation_factor", "dilation_mode", "target_device",
          "target_link_rate"]  # fmt: skip
MEANS = ["step_time_s", "step_p50_s", "step_p95_s", "wire_gb_total"]
# figures whose intervals use the run-to-run spread pooled over configurations (results.intervals.pool)
POOLED = ["images_per_sec", "emulator_images_per_sec", "images_per_sec_per_device"]
# a concurrent job: its workload's k (jobs together) and companions (ITSELF: k copies of one job; MIXED), its images/sec
# alone and together, the target's first (as in runs.parquet), and its slowdown, means over the repeats with 95%
# intervals from the spread pooled over every job (:func:`concurrent_table`)
CONCURRENT_COLUMNS = ["workload", "job", "overrides", "strategy", "k", "companions", "repeats"]
CONCURRENT_COLUMNS += ["alone_images_per_sec", "together_images_per_sec", "together_ci_low", "together_ci_high"]
CONCURRENT_COLUMNS += ["slowdown", "slowdown_ci_low", "slowdown_ci_high"]
CONCURRENT_COLUMNS += ["dilation_factor", "alone_emulator_images_per_sec", "together_emulator_images_per_sec"]
ITSELF, MIXED = "itself", "mixed"  # a concurrent workload of one job's copies, or of different jobs
RECORDED_TARGET = "target_images_per_sec"  # the record's field that tables show as images_per_sec
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
    row = {key: getattr(record, key) for key in RunMetrics.columns() if key != RECORDED_TARGET}
    row.update(throughput(record))  # images_per_sec keeps its place, the target's figure
    row["strategy"] = record.arm
    row["overlap"] = record.overlap
    row["variant"] = record.variant  # the experiment.variants entry (None: the matrix's own run)
    row["repeat"] = record.repeat
    row["classes"] = record.num_classes
    row["run"] = record.run
    row["devices"] = record.world_size or record.workers + record.num_ps
    row["link_gbit"], row["link_source"] = link_rate(record.rate, record.cluster_kind, plan)
    row["images_per_sec_per_device"] = row["images_per_sec"] / row["devices"]  # the target's, as images_per_sec
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


def throughput(record: RunMetrics) -> dict[str, float]:
    """A run's images/sec as the tables show it: the target's first (target-equivalent, measured x D, where dilated;
    the measured figure where not, D = 1), then the emulator's wall-clock figure."""
    target = record.target_images_per_sec
    images_per_sec = record.images_per_sec if target is None else float(target)
    return {"images_per_sec": images_per_sec, "emulator_images_per_sec": record.images_per_sec}


def dilation_columns(record: RunMetrics) -> dict[str, Any]:
    """A run's time-dilated emulation (engine/dilation.py): factor, mode, target device and link rate, overruns,
    stalls and lateness; nulls and 0s for an undilated run."""
    d = record.dilation or {}
    return {
        "dilation_factor": record.dilation_factor,
        "dilation_mode": d.get("mode"),
        "target_device": d.get("target_device"),
        "target_link_rate": d.get("target_link_rate"),
        "overruns": int(d.get("overruns", 0)),
        "stalls": int(d.get("stalls", 0)),  # units late only because this host ran another thread
        "late_s": float(d.get("late_s", 0.0)),  # lateness against the target left at a measured step's end
    }


def order(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows sorted by `keys`, strategies in STRATEGIES order with each sequential ablation after its strategy and the
    rows of experiment.variants after both, by name (``ralp_n``, ``ralp_n-d16``, ``ralp_n-real``)."""
    rank = {arm(s, overlap): 2 * i + (not overlap) for i, s in enumerate(STRATEGIES) for overlap in (True, False)}

    def position(name: str) -> str:
        base = max((a for a in rank if name == a or name.startswith(a + "-")), key=len, default=None)
        return f"{rank.get(base, len(rank)) if base else len(rank):04d}/{'' if name == base else name}"

    ordered = frame.sort_values(keys, key=lambda col: col.map(position) if col.name == "strategy" else col)
    return ordered.reset_index(drop=True)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with nullable integer and string types where a column may be null (split, names of things)."""
    strings = ["split_unit", "link_source", "device", "backend", "loader", "profile_kind", "profile_device", "variant"]
    strings += ["dilation_mode", "target_device", "target_link_rate"]
    floats = ["link_gbit", "dilation_factor"]
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


def interval_pool(repeats: pd.DataFrame) -> pd.Series:
    """Which pool each repeat's configuration estimates its run-to-run spread with (:func:`pooled_estimates`):
    dilated runs (both modes: a step's time is the padded units' and the emulated links') apart from undilated
    ones (this host's own speed)."""
    return repeats["dilation_factor"].notna().map({True: "dilated", False: "undilated"})


def pooled_estimates(repeats: pd.DataFrame, column: str) -> dict[tuple[Any, ...], Estimate]:
    """Each configuration's mean of `column` with its 95% interval from the relative SD pooled over the
    configurations of its :func:`interval_pool` (:func:`ralp_pipe.results.intervals.pool`)."""
    pools = interval_pool(repeats)
    out: dict[tuple[Any, ...], Estimate] = {}
    for _, members in repeats.groupby(pools, sort=False):
        groups = {
            key: [float(v) for v in g[column]] for key, g in members.groupby(CONFIGURATION, sort=False, dropna=False)
        }
        spread = pool(list(groups.values()))
        out.update({key: pooled_interval(values, spread) for key, values in groups.items()})
    return out


def _configuration_row(repeats: pd.DataFrame, estimates: dict[str, Estimate]) -> dict[str, Any]:
    """The row of one configuration: its shared settings and the mean (with interval) over its repeats."""
    first = repeats.iloc[0]
    for column in SHARED:
        if repeats[column].nunique(dropna=False) > 1:
            raise ConfigError(
                f"the repeats of {first['run'].rsplit('/', 1)[0]} disagree on {column} "
                f"({', '.join(map(str, repeats[column].unique()))}): aggregate the runs of one experiment"
            )
    row = {key: first[key] for key in CONFIGURATION + ["overlap", "variant", *SHARED, "split_unit"]}
    row["run"] = first["run"].rsplit("/", 1)[0]
    row["repeats"] = len(repeats)
    target = estimates["images_per_sec"]  # the target's (see the module docstring)
    own = _estimate(repeats["images_per_sec"])
    row.update(
        images_per_sec=target.mean,
        images_per_sec_std=target.std,
        images_per_sec_df=target.dof,
        images_per_sec_own_std=own.std,
        images_per_sec_ci_low=target.low,
        images_per_sec_ci_high=target.high,
    )
    emulator = estimates["emulator_images_per_sec"]
    row.update(
        emulator_images_per_sec=emulator.mean,
        emulator_images_per_sec_ci_low=emulator.low,
        emulator_images_per_sec_ci_high=emulator.high,
        overruns=int(repeats["overruns"].sum()),
        stalls=int(repeats["stalls"].sum()),
        late_s=float(repeats["late_s"].max()),
    )
    per_device = estimates["images_per_sec_per_device"]
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
    """runs.parquet: one row per configuration, with speedups over each of :data:`BASELINES` in the same group."""
    groups = repeats.groupby(CONFIGURATION, sort=False, dropna=False)
    pooled = {column: pooled_estimates(repeats, column) for column in POOLED}
    rows = [_configuration_row(group, {c: pooled[c][key] for c in POOLED}) for key, group in groups]
    frame = _typed(order(pd.DataFrame(rows), CONFIGURATION))
    frame["interval_pool"] = interval_pool(frame)
    estimates = pooled["images_per_sec"]
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
    # a dilated configuration's plan priced the target's devices and link: its prediction is of the target's figure
    frame["prediction_error"] = relative_error(frame["predicted_images_per_sec"], frame["images_per_sec"])
    return frame


def baselines_present(runs: pd.DataFrame) -> list[str]:
    """The :data:`BASELINES` some configuration of `runs` ran (the speedups summary.md and the plots show)."""
    return [baseline for baseline in BASELINES if (runs["strategy"] == baseline).any()]


def speedups_table(runs: pd.DataFrame) -> pd.DataFrame:
    """speedups.parquet: the target's images/sec of each configuration next to each baseline's, their ratio and its
    interval, then the emulator's wall-clock images/sec."""
    frame = runs[CONFIGURATION + ["repeats", "images_per_sec", "dilation_factor", "overruns", "late_s"]].copy()
    for baseline in BASELINES:
        ratio = runs[f"speedup_vs_{baseline}"]
        frame[f"{baseline}_images_per_sec"] = frame["images_per_sec"] / ratio
        frame[f"speedup_vs_{baseline}"] = ratio
        frame[f"speedup_vs_{baseline}_ci_low"] = runs[f"speedup_vs_{baseline}_ci_low"]
        frame[f"speedup_vs_{baseline}_ci_high"] = runs[f"speedup_vs_{baseline}_ci_high"]
    frame["emulator_images_per_sec"] = runs["emulator_images_per_sec"]
    frame["interval_method"] = SPEEDUP_METHOD
    return frame.reset_index(drop=True)


def _target_or_measured(images_per_sec: float, factor: float | None) -> float:
    """Target-equivalent images/sec where dilated (measured x `factor`), the measured figure where not."""
    target = target_equivalent(images_per_sec, factor)
    return images_per_sec if target is None else target


def _runs(workload: str, job: dict[str, Any], side: str) -> list[float]:
    """A concurrent job's measured images/sec `side` (alone / together) in every round (its mean where the file
    predates the rounds' lists)."""
    runs = job.get(f"{side}_runs", [job[f"{side}_images_per_sec"]])
    if not runs or any(not float(v) > 0 for v in runs):
        raise DataError(f"concurrent workload {workload}: job {job.get('job')} has {side} images/sec {runs}")
    return [float(v) for v in runs]


def _job_strategy(job: dict[str, Any]) -> str:
    """The job's strategy as its concurrent.json records it (older files: its strategy= override; '' without)."""
    named = [o.split("=", 1)[1] for o in job["overrides"] if o.startswith("strategy=")]
    return str(job.get("strategy", named[-1] if named else ""))


def concurrent_row(workload: str, doc: dict[str, Any], job: dict[str, Any], spread: Pool) -> dict[str, Any]:
    """One job of a concurrent workload (`doc`, its concurrent.json): its k and companions, images/sec alone and
    together, the target's (measured x D where the jobs were dilated, the measured figures where not), means over
    the rounds with 95% intervals of the pooled relative spread `spread`, the slowdown alone / together of those
    (delta-method interval), then D and the emulator's wall-clock images/sec."""
    if "dilation_factor" not in job:
        raise DataError(
            f"concurrent workload {workload}: job {job.get('job')} does not record its dilation factor (written "
            f"before concurrent.json did): re-run `ralp-pipe concurrent` for it"
        )
    factor = None if job["dilation_factor"] is None else float(job["dilation_factor"])
    runs = {side: _runs(workload, job, side) for side in ("alone", "together")}
    target = {
        side: pooled_interval([_target_or_measured(v, factor) for v in values], spread) for side, values in runs.items()
    }
    slowdown = ratio_interval(target["alone"], target["together"])
    jobs = doc["jobs"]
    return {
        "workload": workload,
        "job": int(job["job"]),
        "overrides": " ".join(job["overrides"]),
        "strategy": _job_strategy(job),
        "k": len(jobs),
        "companions": ITSELF if len({tuple(j["overrides"]) for j in jobs}) == 1 else MIXED,
        "repeats": min(len(v) for v in runs.values()),
        "alone_images_per_sec": target["alone"].mean,
        "together_images_per_sec": target["together"].mean,
        "together_ci_low": target["together"].low,
        "together_ci_high": target["together"].high,
        "slowdown": slowdown.mean,
        "slowdown_ci_low": slowdown.low,
        "slowdown_ci_high": slowdown.high,
        "dilation_factor": math.nan if factor is None else factor,
        "alone_emulator_images_per_sec": math.fsum(runs["alone"]) / len(runs["alone"]),
        "together_emulator_images_per_sec": math.fsum(runs["together"]) / len(runs["together"]),
    }


def concurrent_spread(workloads: Sequence[tuple[str, dict[str, Any]]]) -> Pool:
    """The run-to-run spread of ln images/sec pooled over every concurrent job's rounds, alone and together (a job
    alone counted once where several jobs share its alone runs: of one workload, or of the workloads of one call,
    whose record names the workload that ran them, ``alone_in``)."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for name, doc in workloads:
        for job in doc["jobs"]:
            alone = (job.get("alone_in", name), "alone", job.get("alone_of", job["job"]))
            groups[alone] = _runs(name, job, "alone")
            groups[(name, "together", job["job"])] = _runs(name, job, "together")
    return pool(list(groups.values()))


def concurrent_table(workloads: Sequence[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """concurrent.parquet: each job of each concurrent workload (:func:`concurrent_row`), its intervals from the
    spread of :func:`concurrent_spread`."""
    spread = concurrent_spread(workloads)
    rows = [concurrent_row(name, doc, job, spread) for name, doc in workloads for job in doc["jobs"]]
    frame = pd.DataFrame(rows, columns=CONCURRENT_COLUMNS).astype({"dilation_factor": "float64", "k": "int64"})
    return frame.sort_values(["workload", "job"]).reset_index(drop=True)


def slowdown_by_k(concurrent: pd.DataFrame) -> pd.DataFrame:
    """Slowdown against k per strategy and companions: the mean over the jobs of that strategy in workloads of that
    k (the jobs of one workload ran at once, so their mean's interval is bounded by the mean of their intervals,
    which it shows), with k = 1 (each job alone: 1 by definition) first."""
    keys = ["strategy", "companions", "k"]
    if concurrent.empty:
        return pd.DataFrame(columns=[*keys, "jobs", "slowdown", "slowdown_ci_low", "slowdown_ci_high"])
    frame = (
        concurrent.assign(jobs=1)
        .groupby(keys, as_index=False)
        .agg(
            jobs=("jobs", "sum"),
            slowdown=("slowdown", "mean"),
            slowdown_ci_low=("slowdown_ci_low", "mean"),
            slowdown_ci_high=("slowdown_ci_high", "mean"),
        )
    )
    alone = (
        frame[keys[:2]].drop_duplicates().assign(k=1, jobs=0, slowdown=1.0, slowdown_ci_low=1.0, slowdown_ci_high=1.0)
    )
    return pd.concat([alone, frame]).sort_values(keys).reset_index(drop=True)
