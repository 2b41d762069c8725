"""summary.md's sections on how far its figures can be trusted: real against modelled emulation, this machine's
measured profile beside the target's, and the interval estimator with the widest intervals and the overruns.

- *Real vs modelled*: every configuration run in ``dilation.mode=real`` (an experiment.variants entry, its ranks
  computing) next to its ``modelled`` twin, the same configuration at the same D where the experiment has one, else
  the matrix's modelled row; the difference of the target-equivalent images/sec in % with its 95% delta-method
  interval (:func:`ralp_pipe.results.intervals.ratio_interval`).
- *Profiles and splits*: for each plan made from a profile measured here (experiment.measured_profiles), every
  strategy's split and predicted images/sec from that profile beside those of the plan the runs used.
- *Intervals*: which estimator gave the intervals (the spread pooled per pool, :mod:`ralp_pipe.results.tables`),
  each pool's degrees of freedom and relative SD beside its most varying configuration's own, the widest
  half-width in % of its mean, and the overruns of every dilated run.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from ralp_pipe.config.schema import MODELLED, REAL
from ralp_pipe.contract.records import Plan
from ralp_pipe.results.intervals import LEVEL, Estimate, ratio_interval
from ralp_pipe.results.markdown import fmt, plus_minus, table
from ralp_pipe.results.tables import GROUP

PlanKey = tuple[str, str, int, str]  # (dataset, model, N, network)
MODES_HEAD = [
    "model",
    "N",
    "network",
    "strategy",
    "row",
    "mode",
    "D",
    "loader",
    "repeats",
    "target-equivalent images/sec",
]
PROFILES_HEAD = ["model", "dataset", "N", "network", "profile", "strategy", "split", "predicted images/sec"]


def fidelity_markdown(runs: pd.DataFrame, measured: Mapping[PlanKey, Plan], plans: Mapping[PlanKey, Plan]) -> str:
    """The three sections, each left out where it has nothing to show (the intervals' always shows)."""
    return modes_markdown(runs) + profiles_markdown(measured, plans) + intervals_markdown(runs)


def _base_strategy(row: Any) -> str:
    """The row's name without its variant's suffix (``ralp_n-real`` -> ``ralp_n``)."""
    variant = row.variant
    return str(row.strategy) if variant is None or variant is pd.NA else str(row.strategy).removesuffix(f"-{variant}")


def _estimate(row: Any) -> Estimate:
    half = (row.images_per_sec_ci_high - row.images_per_sec_ci_low) / 2
    return Estimate(row.images_per_sec, row.images_per_sec_std, int(row.repeats), half, float(row.images_per_sec_df))


def twin_of(row: Any, runs: pd.DataFrame) -> Any | None:
    """The modelled twin of real-mode configuration `row`: its group's modelled row of the same strategy at the same
    D, else at any D (None without one)."""
    group = runs
    for column in GROUP:
        group = group[group[column] == getattr(row, column)]
    modelled = group[group["dilation_mode"].eq(MODELLED).fillna(False).astype(bool)]
    candidates = [r for r in modelled.itertuples() if _base_strategy(r) == _base_strategy(row)]
    same = [r for r in candidates if r.dilation_factor == row.dilation_factor]
    found = same or candidates
    return found[0] if found else None


def _mode_row(row: Any) -> list[str]:
    return [
        row.model,
        str(row.gpus),
        row.network,
        _base_strategy(row),
        row.strategy,
        str(row.dilation_mode),
        f"{row.dilation_factor:g}",
        str(row.loader),
        str(row.repeats),
        plus_minus(row.images_per_sec, row.images_per_sec_ci_low, row.images_per_sec_ci_high),
    ]


def modes_markdown(runs: pd.DataFrame) -> str:
    """Real vs modelled: each real-mode configuration, its modelled twin and their difference ('' without one)."""
    real = list(runs[runs["dilation_mode"].eq(REAL).fillna(False).astype(bool)].itertuples())
    if not real:
        return ""
    rows, lines = [], []
    for row in real:
        twin = twin_of(row, runs)
        rows.append(_mode_row(row))
        if twin is None:
            lines.append(f"- {row.model} N={row.gpus} {row.strategy}: no modelled twin in this experiment.")
            continue
        rows.append(_mode_row(twin))
        change = ratio_interval(_estimate(row), _estimate(twin))
        difference = plus_minus(100 * (change.mean - 1), 100 * (change.low - 1), 100 * (change.high - 1), 1, "%")
        lines.append(
            f"- {row.model} N={row.gpus} {row.network} {_base_strategy(row)}: real - modelled = {difference} "
            f"({LEVEL:.0%} delta-method interval), at D = {row.dilation_factor:g} and {twin.dilation_factor:g}."
        )
    intro = (
        "In `real` mode every rank computes each unit (on the batch and crop of `dilation.compute_*`, its workers "
        "reading the shards through the loader named) and waits out D x the target's time for it; in `modelled` "
        "mode no rank computes and each unit only waits. Both send the target's bytes over the same emulated links. "
        "The difference is what the modelled runs of this summary would miss of the real computation's timing."
    )
    return "\n".join(["## Real vs modelled", "", intro, "", table(MODES_HEAD, rows), "", *lines, "", ""])


def _split_cell(entry: Mapping[str, Any]) -> str:
    split = entry.get("split")
    if split is None:
        return "-"
    unit = entry.get("split_after_unit")
    return f"{unit} ({split})" if unit else str(split)


def _profile_cell(plan: Plan) -> str:
    return f"{plan.profile_kind or '?'} ({plan.profile_device or '?'})"


def profiles_markdown(measured: Mapping[PlanKey, Plan], plans: Mapping[PlanKey, Plan]) -> str:
    """Profiles and splits: each plan from this machine's measured profile beside the runs' plan of the same
    configuration ('' without measured plans)."""
    if not measured:
        return ""
    rows = []
    for key in sorted(measured):
        dataset, model, gpus, network = key
        for plan in (p for p in (plans.get(key), measured[key]) if p is not None):
            for strategy, entry in plan.strategies.items():
                predicted = float(entry.get("predicted_images_per_sec") or math.nan)
                cells = [model, dataset, str(gpus), network, _profile_cell(plan), strategy, _split_cell(entry)]
                rows.append([*cells, fmt(predicted)])
    intro = (
        "This machine's compute, measured by `ralp-pipe profile`, beside the profile the runs were planned with "
        "(modelled for the target GPU), each planned for the same cluster and link: the split the planner picks "
        "from each and the images/sec it predicts (the measured profile's are this machine's CPUs as the devices, "
        "sharing its cores). Only the modelled profile's plan was trained."
    )
    return "\n".join(["## Profiles and splits", "", intro, "", table(PROFILES_HEAD, rows), "", ""])


def intervals_markdown(runs: pd.DataFrame) -> str:
    """Intervals: the estimator, each pool's spread, the widest half-width and the overruns."""
    lines = [
        "## Intervals",
        "",
        f"Every interval is {LEVEL:.0%}. A configuration's images/sec interval uses the run-to-run spread pooled "
        "over the configurations of its pool (dilated runs, of either mode, in one; undilated in another): the "
        "variance of ln images/sec within each configuration, summed and divided by the sum of repeats - 1, "
        "which is also the t quantile's degrees of freedom; half-width = t x pooled relative SD x mean / "
        "sqrt(repeats). It assumes the configurations of a pool vary alike between fresh sets of ranks (the "
        "host's scheduling, the emulated links' jitter); the largest configuration's own SD is shown beside. "
        "Speedups and differences take the delta method over two such means.",
        "",
    ]
    rows = []
    for name, members in runs.groupby("interval_pool", sort=True):
        relative = (members["images_per_sec_std"] / members["images_per_sec"]).max()
        own = members["images_per_sec_own_std"] / members["images_per_sec"]
        half = (members["images_per_sec_ci_high"] - members["images_per_sec_ci_low"]) / 2 / members["images_per_sec"]
        widest, varied = (
            members.iloc[int(half.fillna(-1).to_numpy().argmax())],
            members.iloc[int(own.fillna(-1).to_numpy().argmax())],
        )
        rows.append(
            [
                str(name),
                str(len(members)),
                fmt(members["images_per_sec_df"].max(), 0),
                fmt(100 * relative, 2, "%"),
                f"{fmt(100 * own.max(), 2, '%')} ({_named(varied)})",
                f"{fmt(100 * half.max(), 2, '%')} ({_named(widest)})",
            ]
        )
    head = ["pool", "configurations", "df", "pooled relative SD", "largest own SD", "widest half-width (% of mean)"]
    lines += [table(head, rows), ""]
    dilated = runs[runs["dilation_factor"].notna()]
    if len(dilated):
        lines += [
            f"Overruns: {int(dilated['overruns'].sum())} over the {int(dilated['repeats'].sum())} dilated runs "
            f"(stalls: {int(dilated['stalls'].sum())}).",
            "",
        ]
    return "\n".join(lines) + "\n"


def _named(row: pd.Series) -> str:
    return f"{row['model']} N={row['gpus']} {row['network']} {row['strategy']}"
