"""Where a step's time goes, per run: compute, communication wait, data wait and the PS side (breakdown.parquet).

From each run's steps.parquet, over its measured steps (see :mod:`ralp_pipe.engine.metrics` for
what each column times):

- ``step_time_s``, ``compute_s``, ``comm_wait_s``, ``data_wait_s``: the workers' step and its three
  parts, each the mean over worker ranks and measured steps, so the parts add up to the step;
- ``comm_share``: ``comm_wait_s / step_time_s``, the share of a worker's step spent waiting on
  transfers (for ``ps``, the paper's premise that the parameter servers' link is the bottleneck);
- ``ps_compute_s``, ``ps_comm_wait_s``: the same means over the server ranks (``ps`` processes or
  RALP's PS device), null for ``allreduce``. A server works while the workers wait, so its time is
  shown beside the workers' step, not added to it;
- ``overruns``: in a time-dilated run, the padded units of all ranks that outlasted their padded time in
  the measured steps (:mod:`ralp_pipe.engine.dilation`; there a step's compute includes the padding);
- ``dilation_factor``: that run's factor D (null where undilated). Its seconds are as measured, D times the
  target's: :func:`target_seconds` divides them by D, so runs at different factors compare.

Steps recorded before the data wait was timed on its own have no ``data_wait_s`` column: their
data wait is null and their compute includes it. The summary's section averages the repeats of
each configuration.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from ralp_pipe.config import STRATEGY_KINDS
from ralp_pipe.contract.records import RunMetrics
from ralp_pipe.contract.topology import WORKER
from ralp_pipe.engine.metrics import MEASURE, measured_overruns
from ralp_pipe.errors import DataError
from ralp_pipe.results.markdown import fmt, table

KEYS = ["model", "dataset", "gpus", "network", "strategy", "repeat", "run"]  # strategy: the row name (arm)
PARTS = ["compute_s", "comm_wait_s", "data_wait_s"]  # a worker's step, in the order the plot stacks them
SERVER = ["ps_compute_s", "ps_comm_wait_s"]
FIGURES = ["step_time_s", *PARTS, "comm_share", *SERVER]
DILATED_SECONDS = " Time-dilated runs: the target's seconds, as measured / D."
REQUIRED = ("role", "phase", "step_time_s", "compute_s", "comm_wait_s")  # in every steps.parquet


def _mean(rows: pd.DataFrame, column: str) -> float:
    return float(rows[column].mean()) if column in rows and not rows.empty else math.nan


def run_breakdown(record: RunMetrics, steps: pd.DataFrame) -> dict[str, Any]:
    """The breakdown row of one run from its record and its steps.parquet."""
    missing = [column for column in REQUIRED if column not in steps]
    if missing:
        raise DataError(
            f"steps.parquet of run {record.run} lacks column {', '.join(map(repr, missing))}: re-run `ralp-pipe train`"
        )
    measured = steps[steps["phase"] == MEASURE]
    workers, servers = measured[measured["role"] == WORKER], measured[measured["role"] != WORKER]
    if workers.empty:
        raise DataError(f"steps.parquet of run {record.run} has no measured step of a worker: re-run `ralp-pipe train`")
    row: dict[str, Any] = {key: getattr(record, key) for key in KEYS if key != "strategy"}
    row["strategy"] = record.arm
    row["step_time_s"] = _mean(workers, "step_time_s")
    row.update({part: _mean(workers, part) for part in PARTS})
    row["comm_share"] = row["comm_wait_s"] / row["step_time_s"] if row["step_time_s"] > 0 else math.nan
    row["ps_compute_s"], row["ps_comm_wait_s"] = _mean(servers, "compute_s"), _mean(servers, "comm_wait_s")
    row["overruns"] = measured_overruns(measured.to_dict("records"))
    row["dilation_factor"] = record.dilation_factor
    return row


def breakdown_table(runs: Iterable[tuple[RunMetrics, pd.DataFrame]]) -> pd.DataFrame:
    """breakdown.parquet: one row per run from its (record, steps.parquet), in the order given."""
    rows = [run_breakdown(record, steps) for record, steps in runs]
    return pd.DataFrame(rows, columns=[*KEYS, *FIGURES, "overruns", "dilation_factor"])


def target_seconds(breakdown: pd.DataFrame) -> pd.DataFrame:
    """`breakdown` with every dilated run's seconds divided by its factor: the target's (undilated rows as they are)."""
    factor = breakdown["dilation_factor"].fillna(1.0)
    seconds = [column for column in FIGURES if column.endswith("_s")]
    return breakdown.assign(**{column: breakdown[column] / factor for column in seconds})


def by_configuration(breakdown: pd.DataFrame) -> pd.DataFrame:
    """The breakdown averaged over the repeats of each configuration (model, dataset, N, network, strategy)."""
    return breakdown.groupby(KEYS[:-2], sort=False, dropna=False)[FIGURES].mean().reset_index()


def breakdown_markdown(breakdown: pd.DataFrame) -> str:
    """The summary's time-breakdown section with the share of a `ps` step that is communication ('' if no runs)."""
    if breakdown.empty:
        return ""
    mean = by_configuration(target_seconds(breakdown))
    header = ["model", "dataset", "N", "network", "strategy", "step (s)", "compute (s)", "comm wait (s)"]
    header += ["data wait (s)", "comm share", "PS compute (s)", "PS comm wait (s)"]
    rows = [
        [r.model, r.dataset, str(r.gpus), r.network, r.strategy, fmt(r.step_time_s, 3), fmt(r.compute_s, 3)]
        + [fmt(r.comm_wait_s, 3), fmt(r.data_wait_s, 3), fmt(100 * r.comm_share, 0, "%")]
        + [fmt(r.ps_compute_s, 3), fmt(r.ps_comm_wait_s, 3)]
        for r in mean.itertuples()
    ]
    parts = [
        "## Time breakdown of a step",
        "",
        "Per configuration, over the measured steps and the repeats: a worker's step time and its parts "
        "(compute, waiting on transfers, waiting for the next batch), and the server ranks' own compute "
        "and wait (ps processes or RALP's PS device; they work while the workers wait)."
        + (DILATED_SECONDS if breakdown["dilation_factor"].notna().any() else ""),
        "",
        table(header, rows),
        "",
    ]
    for baseline in (name for name, kind in STRATEGY_KINDS.items() if kind.baseline):
        parts += _comm_share_sentence(baseline, mean[mean["strategy"] == baseline]["comm_share"].dropna())
    return "\n".join(parts) + "\n"  # a blank line before the section that follows


def _comm_share_sentence(strategy: str, shares: pd.Series) -> list[str]:
    """How much of a `strategy` worker's step is communication wait, over its configurations (none: nothing)."""
    if len(shares) == 1:
        return [
            f"Communication wait is {100 * shares.iloc[0]:.0f}% of a `{strategy}` worker's step (one configuration).",
            "",
        ]
    if len(shares) > 1:
        return [
            f"Communication wait is {100 * shares.mean():.0f}% of a `{strategy}` worker's step on average "
            f"({100 * shares.min():.0f}% to {100 * shares.max():.0f}% over {len(shares)} configurations).",
            "",
        ]
    return []
