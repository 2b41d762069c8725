"""summary.md: the runs table per network as Markdown, with intervals, speedups, volume and predictions.

The time breakdown's section comes from :mod:`ralp_pipe.results.breakdown`; the concurrent jobs'
section is :func:`concurrent_markdown`.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ralp_pipe.results.accuracy import median_abs_error
from ralp_pipe.results.intervals import LEVEL
from ralp_pipe.results.markdown import fmt, plus_minus, table
from ralp_pipe.results.tables import baselines_present, slowdown_by_k

# the columns that name a configuration, at the head of both tables of a network
HEAD = ["model", "dataset", "classes", "N", "strategy", "devices", "global batch"]
THROUGHPUT_HEAD = ["split", "repeats", "images/sec", "per device", "step p50 / p95 (s)"]  # then "vs <baseline>"
# where a run was time-dilated: the target's figures first, the emulator's wall-clock images/sec last
DILATED_THROUGHPUT = {"images/sec": "target-equivalent images/sec"}
EMULATOR_HEAD = "emulator images/sec (wall clock)"
VOLUME_HEAD = ["GB/step", "wire GB/step", "predicted"]
DILATED_NOTE = (
    " Time-dilated emulation (D = the dilation factor; every unit was padded to D x the target device's time "
    "and links ran at their rate / D): images/sec is the target's, target-equivalent images/sec = the emulator's "
    "wall-clock images/sec x D, with its interval, and step times are the target's seconds (measured / D); "
    "speedups, GB/step, splits and predictions are those of the target. The emulator's own wall-clock images/sec "
    "is the last column, naming what it emulates; a run whose units outlasted their padded time has overruns, "
    "named there: the target's timing was not reproduced."
)


def summary_markdown(runs: pd.DataFrame) -> str:
    """summary.md: per network, throughput with intervals and speedups, then volume and predictions, one row per configuration."""
    dilated = bool(runs["dilation_factor"].notna().any())
    parts = ["# Results", "", _introduction(runs) + (DILATED_NOTE if dilated else ""), ""]
    baselines = baselines_present(runs)
    for network, by_net in runs.groupby("network", sort=True):
        parts += _network_section(str(network), by_net, dilated, baselines)
    return "\n".join(parts) + "\n"  # a blank line before the sections that follow


def _baseline_words(baselines: list[str]) -> str:
    """The baselines speedups are over, in words: "`ps`, over `dtf` and over `allreduce` (pipelined ...)"."""
    if not baselines:
        return "a baseline (none ran here)"
    named = [f"`{b}`" for b in baselines]
    listed = ", over ".join(named[:-1]) + " and over " + named[-1] if len(named) > 1 else named[0]
    return f"{listed} (pipelined: not their `-sequential` rows)"


def _introduction(runs: pd.DataFrame) -> str:
    """What the figures of the summary are."""
    repeats = sorted(set(runs["repeats"]))
    return (
        f"{len(runs)} configurations, {int(runs['repeats'].sum())} runs "
        f"({' or '.join(map(str, repeats))} repeat{'s' * (repeats != [1])} each). Figures are means over the repeats "
        f"± the half-width of a {LEVEL:.0%} t-interval whose run-to-run spread is pooled over configurations "
        "(section Intervals; no ± where no configuration of the pool has 2 repeats). Throughput is "
        "images/sec of all workers; per device divides it by the devices the strategy runs "
        "(workers plus parameter servers or the PS device). The per-worker batch is the same for "
        "every strategy, so the global batch is workers x batch and differs between strategies. "
        "Step p50/p95: median and 95th percentile of the measured steps within a run (mean over repeats). "
        f"Speedups are ratios of mean throughput over {_baseline_words(baselines_present(runs))} at the same "
        f"model, dataset, N and network, with {LEVEL:.0%} delta-method intervals. `-sequential` rows are the "
        "ablation without push/pull overlap (strategy.overlap=false). Split: the unit the lower part ends "
        "with and its index. Each network's heading gives its link: the tc rate the emulated cluster shapes "
        "every host link to, or the payload rate the link probe measured."
    )


def _network_section(network: str, by_net: pd.DataFrame, dilated: bool, baselines: list[str]) -> list[str]:
    """One network's tables: throughput and speedups over `baselines`, then volume and predictions with their median
    error."""
    rows = list(by_net.itertuples())
    errors = by_net["prediction_error"].dropna()
    return [
        f"## Network {network} ({_link_cell(by_net)})",
        "",
        "### Throughput (images/sec) and speedups",
        "",
        table(
            _header(
                HEAD + THROUGHPUT_HEAD + [f"vs {b}" for b in baselines], dilated, DILATED_THROUGHPUT, EMULATOR_HEAD
            ),
            [_throughput_row(r, dilated, baselines) for r in rows],
        ),
        "",
        "### Transfer volume (GB/step) and predicted throughput (images/sec, error against the measurement)",
        "",
        table(HEAD + VOLUME_HEAD, [_volume_row(r) for r in rows]),
        "",
        f"Median absolute error of predicted images/sec: {fmt(100 * median_abs_error(errors), 1, '%')} "
        f"over {len(errors)} configurations with a prediction.",
        "",
    ]


def _header(columns: list[str], dilated: bool, target: dict[str, str], emulator: str) -> list[str]:
    """A table's `columns`; where runs were dilated, the target's figures named as such (`target`, by column) and
    the emulator's wall-clock column last."""
    return [target.get(name, name) for name in columns] + [emulator] if dilated else columns


def _configuration_cells(r: Any) -> list[str]:
    return [r.model, r.dataset, str(r.classes), str(r.gpus), r.strategy, str(r.devices), str(r.global_batch)]


def _throughput_row(r: Any, dilated: bool, baselines: list[str]) -> list[str]:
    """A configuration's split, repeats, the target's images/sec (all and per device), step quantiles (the target's
    seconds) and speedups over `baselines`, then where dilated the emulator's wall-clock images/sec."""
    per_device = (r.images_per_sec_per_device_ci_low, r.images_per_sec_per_device_ci_high)
    factor = 1.0 if math.isnan(r.dilation_factor) else r.dilation_factor
    return [
        *_configuration_cells(r),
        _split_cell(r),
        str(r.repeats),
        plus_minus(r.images_per_sec, r.images_per_sec_ci_low, r.images_per_sec_ci_high),
        plus_minus(r.images_per_sec_per_device, *per_device, 2),
        f"{fmt(r.step_p50_s / factor, 3)} / {fmt(r.step_p95_s / factor, 3)}",
        *(_speedup_cell(r, baseline) for baseline in baselines),
        *([_emulator_cell(r)] if dilated else []),
    ]


def _volume_row(r: Any) -> list[str]:
    """A configuration's counted and wire GB/step and its predicted images/sec with the prediction's error."""
    return [*_configuration_cells(r), fmt(r.gb_total, 4), fmt(r.wire_gb_total, 4), _prediction_cell(r)]


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
    return plus_minus(getattr(row, name), getattr(row, f"{name}_ci_low"), getattr(row, f"{name}_ci_high"), 2, "x")


def _emulator_cell(row: Any) -> str:
    """A dilated configuration's wall-clock images/sec on the emulator, naming what it emulates; 'not dilated' where
    the run was not (its images/sec is its own wall-clock figure)."""
    if math.isnan(row.dilation_factor):
        return "not dilated"
    ends = (row.emulator_images_per_sec_ci_low, row.emulator_images_per_sec_ci_high)
    figure = plus_minus(row.emulator_images_per_sec, *ends)
    flag = f"; {row.overruns} overruns, up to {1e3 * row.late_s:.0f} ms late at a step's end" if row.overruns else ""
    return (
        f"{figure} (dilated emulation of {row.target_device} on {row.target_link_rate}, "
        f"D={row.dilation_factor:g}{flag})"
    )


def _prediction_cell(row: Any) -> str:
    """Predicted images/sec with its relative error against the measurement; '-' without a prediction."""
    predicted = row.predicted_images_per_sec
    return "-" if math.isnan(predicted) else f"{fmt(predicted)} ({fmt(100 * row.prediction_error, 0, '%')})"


CONCURRENT_HEAD = ["workload", "k", "job", "overrides", "alone (img/s)", "together (img/s)", "slowdown"]
DILATED_CONCURRENT = {
    "alone (img/s)": "alone (target-equivalent img/s)",
    "together (img/s)": "together (target-equivalent img/s)",
}
CONCURRENT_EMULATOR_HEAD = "emulator alone / together (img/s, wall clock)"
CONCURRENT_DILATED_NOTE = (
    "Time-dilated jobs: images/sec are the target's, target-equivalent = the emulator's wall-clock images/sec x D "
    "(its own figures last); the slowdown is alone / together of the target's figures."
)
CONCURRENT_NOTE = (
    "k jobs at once with their servers on one host link (k = 1: each job alone); figures are means over the "
    "rounds (repeats), ± the 95% half-width from the run-to-run spread pooled over every job's rounds alone and "
    "together; the slowdown's by the delta method."
)
BY_K_HEAD = ["strategy", "beside", "k", "jobs", "slowdown"]


def concurrent_markdown(concurrent: pd.DataFrame) -> str:
    """The summary's section on concurrent jobs, the target's images/sec first, then slowdown against k per strategy
    ('' when there are none)."""
    if concurrent.empty:
        return ""
    dilated = bool(concurrent["dilation_factor"].notna().any())
    rows = [_concurrent_cells(r, dilated) for r in concurrent.itertuples()]
    header = _header(CONCURRENT_HEAD, dilated, DILATED_CONCURRENT, CONCURRENT_EMULATOR_HEAD)
    note = [CONCURRENT_DILATED_NOTE, ""] if dilated else []
    by_k = [_by_k_cells(r) for r in slowdown_by_k(concurrent).itertuples()]
    k_note = (
        "Slowdown against k per strategy, beside itself (k copies of one job) or mixed: the mean over its jobs; "
        "jobs of one workload ran at once, so the interval shown is the mean of theirs (a bound on the mean's)."
    )
    return "\n".join(
        ["## Concurrent workloads on one network", "", CONCURRENT_NOTE, "", *note, table(header, rows), "", k_note, "",
         table(BY_K_HEAD, by_k), ""]
    )  # fmt: skip


def _concurrent_cells(r: Any, dilated: bool) -> list[str]:
    """A concurrent job's row of the summary's table."""
    return [
        str(r.workload),
        str(r.k),
        str(r.job),
        f"`{r.overrides}`",
        fmt(r.alone_images_per_sec),
        plus_minus(r.together_images_per_sec, r.together_ci_low, r.together_ci_high),
        plus_minus(r.slowdown, r.slowdown_ci_low, r.slowdown_ci_high, 2, "x"),
        *([_concurrent_emulator_cell(r)] if dilated else []),
    ]


def _by_k_cells(r: Any) -> list[str]:
    """A row of the slowdown against k (:func:`ralp_pipe.results.tables.slowdown_by_k`)."""
    slowdown = plus_minus(r.slowdown, r.slowdown_ci_low, r.slowdown_ci_high, 2, "x")
    return [str(r.strategy), str(r.companions), str(r.k), str(r.jobs) if r.k > 1 else "alone", slowdown]


def _concurrent_emulator_cell(row: Any) -> str:
    """A dilated job's wall-clock images/sec alone and together on the emulator with its D; 'not dilated' where not."""
    if math.isnan(row.dilation_factor):
        return "not dilated"
    figures = f"{fmt(row.alone_emulator_images_per_sec)} / {fmt(row.together_emulator_images_per_sec)}"
    return f"{figures} (D={row.dilation_factor:g})"
