"""The figures of an experiment, drawn from its tables (:class:`~ralp_pipe.results.tables.Tables`).

One PNG per name of :data:`~ralp_pipe.contract.layout.PLOT_NAMES`, each captioned in the
Snakemake report (workflow/report/plot_<name>.rst). Rows are configurations (means over
repeats); whiskers are the tables' 95% intervals (``<column>_ci_low`` / ``<column>_ci_high``),
absent where a configuration has one repeat. Images/sec are the tables' first figure, the target's:
target-equivalent (the emulator's wall clock x D) where a run was time-dilated, so runs at different
factors lie on one scale; the emulator's own figures are in the tables only. The single-device reference is the ``allreduce``
run at N=1 (one worker, no communication): it draws the ideal linear-scaling line (N times its
images/sec) and is the denominator of the scaling efficiency.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.typing import LineStyleType, MarkerType  # noqa: E402

from ralp_pipe.atomic import Writer, atomic_path, write_together  # noqa: E402
from ralp_pipe.config import REFERENCE, STRATEGIES, strategy_kind  # noqa: E402
from ralp_pipe.config.units import rate_bits_per_s  # noqa: E402
from ralp_pipe.contract.layout import PLOT_NAMES, SEQUENTIAL_SUFFIX  # noqa: E402
from ralp_pipe.results.breakdown import PARTS, by_configuration, target_seconds  # noqa: E402
from ralp_pipe.results.tables import BASELINES, ITSELF, Tables, baselines_present, slowdown_by_k  # noqa: E402

CATEGORY_LABELS = {
    "gb_gradients": "gradients",
    "gb_parameters": "parameters",
    "gb_activations": "activations",
    "gb_activation_gradients": "activation gradients",
    "gb_labels": "labels",
}
PART_LABELS = {"compute_s": "compute", "comm_wait_s": "communication wait", "data_wait_s": "data wait"}
COLOURS = dict(zip(STRATEGIES, plt.get_cmap("tab10").colors))  # type: ignore[attr-defined]  # a ListedColormap
NO_REFERENCE = "no single-device reference run (allreduce at N=1) in this experiment"
TARGET_IMAGES = "target-equivalent images/sec (measured x D)"


def _grid(count: int, width: float = 4.5, height: float = 3.5, most_cols: int = 3) -> tuple[Any, list[Any]]:
    cols = min(max(count, 1), most_cols)
    rows = math.ceil(max(count, 1) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for axis in flat[count:]:
        axis.set_visible(False)
    return fig, flat[:count]


def _lay_out(fig: Any) -> None:
    """Panels, labels and legends packed into the figure, 0.3 inch left for its title where it has one."""
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 1.0 - 0.3 / fig.get_figheight()) if fig.get_suptitle() else None)


def _save(fig: Any, path: Path) -> None:
    _lay_out(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def _empty(axis: Any, text: str) -> None:
    axis.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize="small", transform=axis.transAxes)
    axis.set_axis_off()


def _log_scale(axis: Any, which: str, low: float, high: float) -> None:
    """A log axis from `low` to `high` in plain numbers: at every digit of a decade over up to one
    decade (so a narrow range still has several labels), at 1, 2 and 5 over up to three, at each
    power of ten over more (no crowded minor labels)."""
    scale = getattr(axis, f"{which}axis")
    axis.set(**{f"{which}scale": "log", f"{which}lim": (low, high)})
    decades = math.log10(high / low)
    subs = tuple(range(1, 10)) if decades <= 1 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
    scale.set_major_locator(ticker.LogLocator(subs=subs))
    scale.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    scale.set_minor_formatter(ticker.NullFormatter())


def _style(strategy: str) -> dict[str, Any]:
    """One colour per strategy; its sequential ablation dashed with hollow markers in the same colour
    (a point of its own, at one N, is then still told apart)."""
    base = strategy.removesuffix(SEQUENTIAL_SUFFIX)
    colour, sequential = COLOURS.get(base, "grey"), base != strategy
    face = "white" if sequential else colour
    return {"color": colour, "linestyle": "--" if sequential else "-", "marker": "o", "markerfacecolor": face}


def _errors(frame: pd.DataFrame, column: str) -> np.ndarray:
    """Whisker lengths below and above `column` from its interval columns (0 where there is no interval)."""
    mean = frame[column].to_numpy(dtype=float)
    low = frame[f"{column}_ci_low"].to_numpy(dtype=float)
    high = frame[f"{column}_ci_high"].to_numpy(dtype=float)
    return np.nan_to_num(np.vstack([mean - low, high - mean]), nan=0.0)


def _panels(frame: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    return [(key if isinstance(key, tuple) else (key,), group) for key, group in frame.groupby(keys, sort=True)]


def _images(runs: pd.DataFrame) -> str:
    """What the throughput axes draw: target-equivalent images/sec where `runs` has a time-dilated configuration."""
    return "target-equivalent images/sec" if runs["dilation_factor"].notna().any() else "images/sec"


def _say_dilated(fig: Any, frame: pd.DataFrame, figures: str) -> None:
    """Title `fig` with what its time-dilated `figures` are, where `frame` has a dilated run."""
    if frame["dilation_factor"].notna().any():
        # a tenth of an inch from the top whatever the figure's height (the default sits 2% down)
        fig.suptitle(f"time-dilated runs: {figures}", fontsize="medium", y=1.0 - 0.1 / fig.get_figheight(), va="top")


def reference_rate(runs: pd.DataFrame) -> pd.Series:
    """Images/sec of the single-device reference per (model, dataset), the mean over its networks."""
    strategy, gpus = REFERENCE
    single = runs[(runs["strategy"] == strategy) & (runs["gpus"] == gpus)]
    return single.groupby(["model", "dataset"])["images_per_sec"].mean()


def _lines(group: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(strategy, network, rows by N) of each curve of a panel, in the tables' strategy order."""
    order = list(dict.fromkeys(group["strategy"]))
    curves = group.groupby(["strategy", "network"], sort=False)
    return sorted(
        ((str(s), str(net), line.sort_values("gpus")) for (s, net), line in curves),
        key=lambda c: (order.index(c[0]), c[1]),
    )


def throughput_vs_n(tables: Tables, path: Path) -> None:
    """Images/sec against N with intervals, one panel per model x dataset x network, and the ideal linear scaling."""
    runs = tables.runs  # images/sec the target's: runs at different factors (dilation.factor=auto) on one scale
    reference = reference_rate(runs)
    panels = _panels(runs, ["model", "dataset", "network"])
    fig, axes = _grid(len(panels))
    for axis, ((model, dataset, network), group) in zip(axes, panels):
        for strategy, _, line in _lines(group):  # one network per panel
            axis.errorbar(
                line["gpus"],
                line["images_per_sec"],
                yerr=_errors(line, "images_per_sec"),
                capsize=3,
                label=f"{strategy} @ {network}",
                **_style(strategy),
            )
        ns = sorted(group["gpus"].unique())
        if (model, dataset) in reference.index:
            ideal = [1, max(ns)]
            axis.plot(ideal, [n * reference[(model, dataset)] for n in ideal], color="black", linestyle=":")
            axis.lines[-1].set_label("ideal: N x single device")
        else:
            axis.text(0.02, 0.98, NO_REFERENCE, transform=axis.transAxes, va="top", fontsize="x-small", wrap=True)
        # the ideal line may leave the panel: the measured points set its height
        top = np.nanmax(group[["images_per_sec", "images_per_sec_ci_high"]].to_numpy(dtype=float))
        axis.set(
            title=f"{model} / {dataset}, {network}",
            xlabel="N (GPUs)",
            ylabel=f"{_images(runs)} (all workers)",
            ylim=(0, 1.15 * top if top > 0 else None),
        )
        axis.set_xticks(ns)
        axis.legend(fontsize="x-small")
    _say_dilated(fig, runs, TARGET_IMAGES)
    _save(fig, path)


def scaling_efficiency(tables: Tables, path: Path) -> None:
    """Images/sec / (N x single-device images/sec) against N, one panel per model x dataset x network."""
    runs = tables.runs  # images/sec the target's: runs at different factors (dilation.factor=auto) on one scale
    reference = reference_rate(runs)
    panels = _panels(runs, ["model", "dataset", "network"])
    fig, axes = _grid(len(panels))
    for axis, ((model, dataset, network), group) in zip(axes, panels):
        if (model, dataset) not in reference.index:
            _empty(axis, f"{model} / {dataset}, {network}: {NO_REFERENCE}")
            continue
        ideal = group["gpus"].to_numpy(dtype=float) * reference[(model, dataset)]
        scaled = group.assign(
            efficiency=group["images_per_sec"] / ideal,
            efficiency_ci_low=group["images_per_sec_ci_low"] / ideal,
            efficiency_ci_high=group["images_per_sec_ci_high"] / ideal,
        )
        for strategy, _, line in _lines(scaled):
            axis.errorbar(
                line["gpus"],
                line["efficiency"],
                yerr=_errors(line, "efficiency"),
                capsize=3,
                label=f"{strategy} @ {network}",
                **_style(strategy),
            )
        axis.axhline(1.0, color="black", linestyle=":", linewidth=0.8)
        axis.set(
            title=f"{model} / {dataset}, {network}", xlabel="N (GPUs)", ylabel="scaling efficiency", ylim=(0, None)
        )
        axis.set_xticks(sorted(group["gpus"].unique()))
        axis.legend(fontsize="x-small")
    _say_dilated(fig, runs, TARGET_IMAGES)
    _save(fig, path)


def _largest_compared_n(group: pd.DataFrame) -> int:
    """The largest N at which a panel compares several strategies (the largest N if none does)."""
    counts = group.groupby("gpus")["strategy"].nunique()
    compared = counts[counts > 1]
    return int((compared if not compared.empty else counts).index.max())


def gb_per_step(tables: Tables, path: Path) -> None:
    """GB/step by category on a log axis, one bar group per strategy at a panel's largest compared N."""
    runs = tables.runs
    panels = _panels(runs, ["model", "dataset"])
    fig, axes = _grid(len(panels), width=5.5)
    for axis, ((model, dataset), group) in zip(axes, panels):
        gpus = _largest_compared_n(group)
        network = sorted(group["network"].unique())[0]
        bars = group[(group["gpus"] == gpus) & (group["network"] == network)].reset_index(drop=True)
        volume = bars[list(CATEGORY_LABELS)].fillna(0.0)
        present = [column for column in CATEGORY_LABELS if (volume[column] > 0).any()]
        width = 0.8 / max(len(present), 1)
        for index, column in enumerate(present):
            values = volume[column].to_numpy(dtype=float)
            shown = values > 0  # a zero has no place on a log axis
            positions = np.arange(len(bars))[shown] + (index - (len(present) - 1) / 2) * width
            colour = f"C{list(CATEGORY_LABELS).index(column)}"
            axis.bar(positions, values[shown], width=width, label=CATEGORY_LABELS[column], color=colour)
        for position, total in enumerate(bars["gb_total"].to_numpy(dtype=float)):
            label = f"{total:.3g} GB" if total > 0 else "0 GB"
            axis.annotate(
                label, (position, 1.0), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize="x-small"
            )
        shown = volume[volume > 0]
        if shown.notna().any().any():  # the smallest bar a third of a decade tall at least
            _log_scale(axis, "y", shown.min().min() / 3, shown.max().max() * 1.5)
        names = [strategy.replace("-", "-\n") for strategy in bars["strategy"]]  # ps-sequential on two lines
        axis.set_xticks(range(len(bars)), names, fontsize="small")
        axis.set(ylabel="GB/step (log scale)")
        axis.set_title(f"{model} / {dataset}, N={gpus}, {network}", pad=16)
        axis.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)


def speedup(tables: Tables, path: Path) -> None:
    """Speedup over each baseline that ran (ps, dtf, byteps, allreduce: a panel each, top to bottom) per strategy
    with interval whiskers."""
    runs = tables.runs
    baselines = baselines_present(runs) or list(BASELINES[:1])
    width_in = max(6.0, 1.6 * runs.groupby(["model", "dataset", "gpus"]).ngroups)
    fig, axes = plt.subplots(len(baselines), 1, figsize=(width_in, 3.5 * len(baselines)), squeeze=False)
    for axis, baseline in zip(axes[:, 0], baselines):
        column = f"speedup_vs_{baseline}"
        compared = runs[(runs["strategy"] != baseline) & runs[column].notna()]
        groups = _panels(compared, ["model", "dataset", "gpus", "network"])
        if not groups:
            _empty(axis, f"no configuration has both {baseline} and another strategy")
            continue
        strategies = list(dict.fromkeys(compared["strategy"]))
        width = 0.8 / len(strategies)
        for index, strategy in enumerate(strategies):
            rows = pd.DataFrame(
                [g[g["strategy"] == strategy].iloc[0] for _, g in groups if strategy in set(g["strategy"])]
            )
            positions = [i for i, (_, g) in enumerate(groups) if strategy in set(g["strategy"])]
            axis.bar(
                np.array(positions) + (index - (len(strategies) - 1) / 2) * width,
                rows[column],
                width=width,
                yerr=_errors(rows, column),
                capsize=3,
                label=strategy,
                color=_style(strategy)["color"],
                hatch="//" if strategy.endswith(SEQUENTIAL_SUFFIX) else None,
            )
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(groups)), [f"{m}\n{d}\nN={n} {net}" for (m, d, n, net), _ in groups])
        axis.tick_params(axis="x", labelsize="x-small")
        axis.set(ylabel=f"speedup over {baseline}")
        axis.set_ylim(bottom=0.0)  # a speedup is positive: a whisker below 0 is cut at the axis
        axis.legend(fontsize="x-small")
    _save(fig, path)


def predicted_vs_measured(tables: Tables, path: Path) -> None:
    """Planner's predicted images/sec against the measured (with its interval), log-log with y = x and ±20%."""
    runs = tables.runs  # images/sec the target's: runs at different factors (dilation.factor=auto) on one scale
    fig, axis = plt.subplots(figsize=(5.5, 5))
    known = runs.dropna(subset=["predicted_images_per_sec"])
    known = known[(known["images_per_sec"] > 0) & (known["predicted_images_per_sec"] > 0)]
    if known.empty:
        _empty(axis, "no configuration has a planner prediction (no plan for its N and network)")
        _save(fig, path)
        return
    for strategy in dict.fromkeys(known["strategy"]):
        points = known[known["strategy"] == strategy]
        axis.errorbar(
            points["images_per_sec"],
            points["predicted_images_per_sec"],
            xerr=_errors(points, "images_per_sec"),
            fmt="o",
            capsize=3,
            label=strategy,
            color=_style(strategy)["color"],
        )
    values = known[["images_per_sec", "predicted_images_per_sec", "images_per_sec_ci_low", "images_per_sec_ci_high"]]
    low, high = values[values > 0].min().min() / 1.2, values.max().max() * 1.2  # the whiskers inside
    axis.plot([low, high], [low, high], color="black", linewidth=0.8, label="y = x")
    for factor in (0.8, 1.2):
        axis.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, linestyle="--")
    _log_scale(axis, "x", low, high)
    _log_scale(axis, "y", low, high)
    axis.set(
        xlabel=f"measured {_images(runs)} (95% interval)",
        ylabel="predicted images/sec",
        title="planner prediction (dashed: ±20%)",
    )
    axis.legend(fontsize="x-small")
    _save(fig, path)


def _target_gbit(runs: pd.DataFrame) -> pd.Series:
    """Each configuration's link in Gbit/s as its plan priced it: the target's rate where dilated, else the run's."""
    target = runs["target_link_rate"].map(
        lambda rate: (rate_bits_per_s(rate) or math.nan) / 1e9 if isinstance(rate, str) else math.nan
    )
    return target.where(runs["dilation_factor"].notna(), runs["link_gbit"]).astype(float)


# the headline's strategies: name, line style, marker, whether the marker is filled
HEADLINE_STYLES: dict[str, tuple[str, LineStyleType, MarkerType, bool]] = {
    "ralp_n": ("RALP-N", "-", "o", True),
    "ralp_h": ("RALP-H", "--", "s", False),
}


def _ps_ranks(runs: pd.DataFrame, baseline: str, shown: pd.DataFrame) -> str:
    """The PS ranks of `baseline`'s runs beside the configurations `shown`, e.g. " (1 PS rank at N=8)" or, for a
    strategy with one PS per worker host, " (8 PS ranks at N=8, one per worker host)"; empty for a baseline without
    any."""
    rows = runs[
        (runs["strategy"] == baseline)
        & runs.set_index(["model", "dataset", "gpus"]).index.isin(shown.set_index(["model", "dataset", "gpus"]).index)
    ]
    counts = sorted({(int(n), int(g)) for n, g in zip(rows["num_ps"], rows["gpus"]) if n})
    if not counts:
        return ""
    where = ", one per worker host" if strategy_kind(baseline).ps_per_host else ""
    return " (" + ", ".join(f"{n} PS rank{'s' * (n != 1)} at N={g}" for n, g in counts) + where + ")"


def speedup_vs_link(tables: Tables, path: Path) -> None:
    """The reproduction's headline: the RALP strategies' speedup over each baseline that ran (ps, dtf, byteps,
    allreduce: a panel each, left to right, titled with its PS ranks and, one per host, their placement) against
    the link rate, at each model x dataset's largest N; measured points with 95% whiskers, the planner's
    prediction for the same devices and link as a line. Both axes are logarithmic: speedups of the paper's matrix
    span 0.3x-20x, and a ratio and its inverse then lie equally far from 1."""
    runs = tables.runs.assign(link=_target_gbit(tables.runs))
    ralp = runs[runs["strategy"].isin(list(HEADLINE_STYLES)) & runs["link"].notna()]
    largest = ralp.groupby(["model", "dataset"])["gpus"].transform("max")
    ralp = ralp[ralp["gpus"] == largest]
    baselines = baselines_present(runs) or list(BASELINES[:1])
    fig, grid = plt.subplots(1, max(2, len(baselines)), figsize=(6.75 * max(2, len(baselines)), 4.5), squeeze=False)
    axes = list(grid[0])
    colours = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # a ListedColormap
    groups = list(ralp.groupby(["model", "dataset", "gpus"], sort=True))
    fig.suptitle("RALP speedup vs link rate: points measured (95% interval), lines the planner's prediction")
    if ralp["link"].nunique() < 2:
        for axis in axes:
            _empty(axis, "one link rate in this experiment: the headline needs several (experiment=paper-dilated)")
        _save(fig, path)
        return
    for axis in axes[len(baselines) :]:
        _empty(axis, "no other baseline ran in this experiment")
    for axis, baseline in zip(axes, baselines):
        base = runs[runs["strategy"] == baseline].set_index(["model", "dataset", "gpus", "network"])
        axis.set_title(f"over {baseline}{_ps_ranks(runs, baseline, ralp)}", fontsize="small")
        shown: list[np.ndarray] = [np.array([1.0])]
        for index, ((model, dataset, gpus), group) in enumerate(groups):
            for strategy, line in group.groupby("strategy", sort=True):
                line = line.sort_values("link")
                keys = list(zip(line["model"], line["dataset"], line["gpus"], line["network"]))
                predicted = line["predicted_images_per_sec"].to_numpy() / base.reindex(keys)[
                    "predicted_images_per_sec"
                ].to_numpy(dtype=float)
                colour = colours[index % len(colours)]
                _, linestyle, marker, filled = HEADLINE_STYLES[str(strategy)]
                axis.plot(
                    line["link"],
                    predicted,
                    color=colour,
                    linestyle=linestyle,
                    label=f"{model}/{dataset} N={gpus} {strategy} predicted",
                )
                column = f"speedup_vs_{baseline}"
                whiskers = _errors(line, column)
                measured = line[column].to_numpy(dtype=float)
                shown += [predicted, measured - whiskers[0], measured + whiskers[1]]
                axis.errorbar(
                    line["link"],
                    measured,
                    yerr=whiskers,
                    fmt=marker,
                    capsize=3,
                    color=colour,
                    markerfacecolor=colour if filled else "none",
                )
        axis.axhline(1.0, color="black", linewidth=0.8)
        rates = np.sort(ralp["link"].unique())
        axis.set_xscale("log")
        axis.set_xticks(rates, labels=[f"{rate:g}" for rate in rates])
        axis.xaxis.set_minor_locator(ticker.NullLocator())
        values = np.concatenate(shown)
        values = values[np.isfinite(values) & (values > 0)]
        _log_scale(axis, "y", values.min() / 1.3, values.max() * 1.3)
        axis.set(xlabel="link rate (Gbit/s; dilated: the target's)", ylabel=f"speedup over {baseline}")
    # one legend for both panels, beside them (inside, it hid the lines near 1x): one entry per model x dataset
    # (its colour), one per strategy (line style and marker)
    handles = [
        Line2D([], [], color=colours[i % len(colours)], label=f"{m}/{d} N={n}")
        for i, ((m, d, n), _) in enumerate(groups)
    ]
    handles += [
        Line2D(
            [],
            [],
            color="grey",
            linestyle=linestyle,
            marker=marker,
            markerfacecolor="grey" if filled else "none",
            label=f"{name}: predicted (line), measured (point)",
        )
        for name, linestyle, marker, filled in HEADLINE_STYLES.values()
    ]
    axes[-1].legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    _save(fig, path)


def breakdown(tables: Tables, path: Path) -> None:
    """A worker's step stacked into compute, communication wait and data wait, beside the servers' compute."""
    frame = by_configuration(target_seconds(tables.breakdown))
    panels = _panels(frame, ["model", "dataset", "network"])
    bars = max((len(group) for _, group in panels), default=1)
    fig, axes = _grid(len(panels), width=max(6.0, 0.8 * bars), height=4.0, most_cols=1)
    for axis, ((model, dataset, network), group) in zip(axes, panels):
        group = group.sort_values("gpus", kind="stable").reset_index(drop=True)
        positions = np.arange(len(group))
        bottom = np.zeros(len(group))
        for index, part in enumerate(PARTS):
            values = np.nan_to_num(group[part].to_numpy(dtype=float), nan=0.0)
            axis.bar(positions - 0.15, values, width=0.5, bottom=bottom, label=PART_LABELS[part], color=f"C{index}")
            bottom += values
        server = group["ps_compute_s"].to_numpy(dtype=float)
        has = ~np.isnan(server)
        axis.bar(
            positions[has] + 0.3,
            server[has],
            width=0.2,
            color="grey",
            hatch="//",
            label="PS-side compute\n(ps ranks, PS device)",
        )
        for position, share, top in zip(positions, group["comm_share"], bottom):
            if not math.isnan(share):
                axis.annotate(f"{share:.0%}", (position - 0.15, top), ha="center", va="bottom", fontsize="x-small")
        axis.set_xticks(positions, [f"{s}\nN={n}" for s, n in zip(group["strategy"], group["gpus"])])
        axis.tick_params(axis="x", labelsize="x-small")
        highest = np.nanmax(np.append(bottom, server))
        axis.set(title=f"{model} / {dataset}, {network}", ylabel="seconds per step (mean)")
        axis.set_ylim(0.0, 1.12 * highest if highest > 0 else 1.0)  # room for the shares above the stacks
        axis.legend(
            fontsize="x-small",
            title="%: communication share",
            title_fontsize="x-small",
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
        )
    _say_dilated(fig, tables.breakdown, "the target's seconds (measured / D)")
    _save(fig, path)


def concurrent_slowdown(tables: Tables, path: Path) -> None:
    """Slowdown (alone / together) against k jobs sharing the PS link, per strategy: beside itself solid, mixed
    dashed (:func:`~ralp_pipe.results.tables.slowdown_by_k`)."""
    frame = slowdown_by_k(tables.concurrent)
    fig, [axis] = _grid(1, width=5.5)
    if frame.empty:
        _empty(axis, "no concurrent workloads in this experiment (experiment.concurrent)")
        _save(fig, path)
        return
    for (strategy, companions), line in frame.groupby(["strategy", "companions"], sort=True):
        style = {**_style(str(strategy)), "linestyle": "-" if companions == ITSELF else "--"}
        axis.errorbar(line["k"], line["slowdown"], yerr=_errors(line, "slowdown"), capsize=3,
                      label=f"{strategy} {'beside itself' if companions == ITSELF else 'in a mixed group'}", **style)  # fmt: skip
    ks = sorted(frame["k"].unique())
    axis.set_xticks(ks, [str(k) for k in ks])
    axis.set(xlabel="jobs sharing the PS link (k; 1: alone)", ylabel="slowdown (alone / together)")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.legend(fontsize="small", loc="upper left")
    _say_dilated(fig, tables.concurrent, "slowdowns of target-equivalent images/sec")
    _save(fig, path)


PLOTS = {
    "throughput_vs_n": throughput_vs_n,
    "scaling_efficiency": scaling_efficiency,
    "gb_per_step": gb_per_step,
    "speedup": speedup,
    "predicted_vs_measured": predicted_vs_measured,
    "breakdown": breakdown,
    "speedup_vs_link": speedup_vs_link,
    "concurrent_slowdown": concurrent_slowdown,
}


def plot_writers(tables: Tables, out: Path) -> dict[Path, Writer]:
    """A writer of every figure of :data:`~ralp_pipe.contract.layout.PLOT_NAMES`, by its PNG file in `out`."""
    return {out / f"{name}.png": functools.partial(PLOTS[name], tables) for name in PLOT_NAMES}


def write_plots(tables: Tables, out: Path) -> list[Path]:
    """Draw every figure into `out` as PNG, all replaced together or none; returns the files."""
    return write_together(plot_writers(tables, out))
