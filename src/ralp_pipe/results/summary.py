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
from ralp_pipe.results.tables import BASELINES

# the columns that name a configuration, at the head of both tables of a network
HEAD = ["model", "dataset", "classes", "N", "strategy", "devices", "global batch"]
THROUGHPUT_HEAD = ["split", "repeats", "images/sec", "per device", "step p50 / p95 (s)", "vs ps", "vs allreduce"]
TARGET_HEAD = ["target-equivalent images/sec"]  # where a run was time-dilated
VOLUME_HEAD = ["GB/step", "wire GB/step", "predicted"]
DILATED_NOTE = (
    " Target-equivalent images/sec (time-dilated emulation, D = the dilation factor): the measured "
    "images/sec x D, with its interval, where every unit was padded to D x the target device's time and "
    "links ran at their rate / D; GB/step, splits and speedups are those of the target. A run whose "
    "units outlasted their padded time has overruns, named in its cell: there the target's timing was "
    "not reproduced."
)


def summary_markdown(runs: pd.DataFrame) -> str:
    """summary.md: per network, throughput with intervals and speedups, then volume and predictions, one row per configuration."""
    dilated = bool(runs["dilation_factor"].notna().any())
    parts = ["# Results", "", _introduction(runs) + (DILATED_NOTE if dilated else ""), ""]
    for network, by_net in runs.groupby("network", sort=True):
        parts += _network_section(str(network), by_net, dilated)
    return "\n".join(parts) + "\n"  # a blank line before the sections that follow


def _introduction(runs: pd.DataFrame) -> str:
    """What the figures of the summary are."""
    repeats = sorted(set(runs["repeats"]))
    return (
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
        "every host link to, or the payload rate the link probe measured."
    )


def _network_section(network: str, by_net: pd.DataFrame, dilated: bool) -> list[str]:
    """One network's tables: throughput and speedups, then volume and predictions with their median error."""
    rows = list(by_net.itertuples())
    errors = by_net["prediction_error"].dropna()
    return [
        f"## Network {network} ({_link_cell(by_net)})",
        "",
        "### Throughput (images/sec) and speedups",
        "",
        table(HEAD + THROUGHPUT_HEAD + (TARGET_HEAD if dilated else []), [_throughput_row(r, dilated) for r in rows]),
        "",
        "### Transfer volume (GB/step) and predicted throughput (images/sec, error against the measurement)",
        "",
        table(HEAD + VOLUME_HEAD, [_volume_row(r) for r in rows]),
        "",
        f"Median absolute error of predicted images/sec: {fmt(100 * median_abs_error(errors), 1, '%')} "
        f"over {len(errors)} configurations with a prediction.",
        "",
    ]


def _configuration_cells(r: Any) -> list[str]:
    return [r.model, r.dataset, str(r.classes), str(r.gpus), r.strategy, str(r.devices), str(r.global_batch)]


def _throughput_row(r: Any, dilated: bool) -> list[str]:
    """A configuration's split, repeats, images/sec (all and per device), step quantiles and speedups."""
    per_device = (r.images_per_sec_per_device_ci_low, r.images_per_sec_per_device_ci_high)
    return [
        *_configuration_cells(r),
        _split_cell(r),
        str(r.repeats),
        plus_minus(r.images_per_sec, r.images_per_sec_ci_low, r.images_per_sec_ci_high),
        plus_minus(r.images_per_sec_per_device, *per_device, 2),
        f"{fmt(r.step_p50_s, 3)} / {fmt(r.step_p95_s, 3)}",
        *(_speedup_cell(r, baseline) for baseline in BASELINES),
        *([_target_cell(r)] if dilated else []),
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


def _target_cell(row: Any) -> str:
    """A dilated configuration's target-equivalent images/sec, naming what it emulates; '-' where undilated."""
    if math.isnan(row.dilation_factor):
        return "-"
    figure = plus_minus(row.target_images_per_sec, row.target_images_per_sec_ci_low, row.target_images_per_sec_ci_high)
    flag = f"; {row.overruns} overruns, up to {1e3 * row.late_s:.0f} ms late at a step's end" if row.overruns else ""
    return (
        f"{figure} (dilated emulation of {row.target_device} on {row.target_link_rate}, "
        f"D={row.dilation_factor:g}{flag})"
    )


def _prediction_cell(row: Any) -> str:
    """Predicted images/sec with its relative error against the measurement; '-' without a prediction."""
    predicted = row.predicted_images_per_sec
    return "-" if math.isnan(predicted) else f"{fmt(predicted)} ({fmt(100 * row.prediction_error, 0, '%')})"


def concurrent_markdown(concurrent: pd.DataFrame) -> str:
    """The summary's section on concurrent jobs ('' when there are none)."""
    if concurrent.empty:
        return ""
    rows = [
        [
            str(r.workload),
            str(r.job),
            f"`{r.overrides}`",
            fmt(r.alone_images_per_sec),
            fmt(r.together_images_per_sec),
            fmt(r.slowdown, 2, "x"),
        ]
        for r in concurrent.itertuples()
    ]
    header = ["workload", "job", "overrides", "alone (img/s)", "together (img/s)", "slowdown"]
    return "\n".join(["## Concurrent workloads on one network", "", table(header, rows), ""])
