"""The figures of an experiment, drawn from runs.parquet: throughput vs N, GB/step, speedups, prediction."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ralp_pipe.atomic import atomic_path  # noqa: E402
from ralp_pipe.config import STRATEGIES  # noqa: E402
from ralp_pipe.results.layout import PLOT_NAMES  # noqa: E402

CATEGORY_LABELS = {
    "gb_gradients": "gradients",
    "gb_parameters": "parameters",
    "gb_activations": "activations",
    "gb_activation_gradients": "activation gradients",
    "gb_labels": "labels",
}


def _grid(count: int) -> tuple[Any, list[Any]]:
    cols = min(count, 3)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    flat = list(axes.flat)
    for axis in flat[count:]:
        axis.set_visible(False)
    return fig, flat[:count]


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def _strategies(runs: pd.DataFrame) -> list[str]:
    return [s for s in STRATEGIES if s in set(runs["strategy"])]


def throughput_vs_n(runs: pd.DataFrame, path: Path) -> None:
    """Images/sec against N, one panel per model x dataset, one line per strategy and network."""
    panels = list(runs.groupby(["model", "dataset"], sort=True))
    fig, axes = _grid(len(panels))
    for axis, ((model, dataset), group) in zip(axes, panels):
        for (strategy, network), line in group.groupby(["strategy", "network"], sort=False):
            line = line.sort_values("gpus")
            axis.plot(line["gpus"], line["images_per_sec"], marker="o", label=f"{strategy} @ {network}")
        axis.set(title=f"{model} / {dataset}", xlabel="N (GPUs)", ylabel="images/sec")
        axis.set_xticks(sorted(group["gpus"].unique()))
        axis.legend(fontsize="small")
    _save(fig, path)


def gb_per_step(runs: pd.DataFrame, path: Path) -> None:
    """Stacked GB/step by category for each strategy, at the largest N and first network of each panel."""
    panels = list(runs.groupby(["model", "dataset"], sort=True))
    fig, axes = _grid(len(panels))
    for axis, ((model, dataset), group) in zip(axes, panels):
        gpus, network = group["gpus"].max(), sorted(group["network"].unique())[0]
        cell = group[(group["gpus"] == gpus) & (group["network"] == network)].set_index("strategy")
        cell = cell.reindex([s for s in _strategies(runs) if s in cell.index])
        bottom = pd.Series(0.0, index=cell.index)
        for column, label in CATEGORY_LABELS.items():
            values = cell[column].fillna(0.0)
            axis.bar(cell.index, values, bottom=bottom, label=label)
            bottom += values
        axis.set(title=f"{model} / {dataset}, N={gpus}, {network}", ylabel="GB/step", ylim=(0, None))
        axis.legend(fontsize="small")
    _save(fig, path)


def speedup(runs: pd.DataFrame, path: Path) -> None:
    """Speedup over ps per strategy, bars grouped by model x dataset x N x network."""
    others = [s for s in _strategies(runs) if s != "ps"]
    groups = list(runs.groupby(["model", "dataset", "gpus", "network"], sort=True))
    fig, axis = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(len(others), 1)), 4))
    width = 0.8 / max(len(others), 1)
    for index, strategy in enumerate(others):
        values = [g.set_index("strategy")["speedup_vs_ps"].get(strategy, math.nan) for _, g in groups]
        axis.bar([i + index * width for i in range(len(groups))], values, width=width, label=strategy)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([i + width * (len(others) - 1) / 2 for i in range(len(groups))])
    axis.set_xticklabels([f"{m}\n{d}\nN={n} {net}" for (m, d, n, net), _ in groups], fontsize="small")
    axis.set(ylabel="speedup over ps")
    axis.legend(fontsize="small")
    _save(fig, path)


def predicted_vs_measured(runs: pd.DataFrame, path: Path) -> None:
    """Planner's predicted images/sec against the measured, one colour per strategy, log-log with y = x and ±20%."""
    fig, axis = plt.subplots(figsize=(5, 5))
    known = runs.dropna(subset=["predicted_images_per_sec"])
    known = known[(known["images_per_sec"] > 0) & (known["predicted_images_per_sec"] > 0)]
    for strategy in _strategies(known) if not known.empty else []:
        points = known[known["strategy"] == strategy]
        axis.scatter(points["images_per_sec"], points["predicted_images_per_sec"], label=strategy)
    values = known[["images_per_sec", "predicted_images_per_sec"]].to_numpy()
    low, high = (values.min() / 1.5, values.max() * 1.5) if len(values) else (0.1, 10.0)
    axis.plot([low, high], [low, high], color="black", linewidth=0.8, label="y = x")
    for factor in (0.8, 1.2):
        axis.plot([low, high], [low * factor, high * factor], color="grey", linewidth=0.6, linestyle="--")
    axis.set(
        xscale="log",
        yscale="log",
        xlim=(low, high),
        ylim=(low, high),
        xlabel="measured images/sec",
        ylabel="predicted images/sec",
        title="planner prediction (dashed: ±20%)",
    )
    axis.legend(fontsize="small")
    _save(fig, path)


PLOTS = {
    "throughput_vs_n": throughput_vs_n,
    "gb_per_step": gb_per_step,
    "speedup": speedup,
    "predicted_vs_measured": predicted_vs_measured,
}


def write_plots(runs: pd.DataFrame, out: Path) -> list[Path]:
    """Draw every figure of :data:`~ralp_pipe.results.layout.PLOT_NAMES` into `out` as PNG; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in PLOT_NAMES:
        PLOTS[name](runs, out / f"{name}.png")
        paths.append(out / f"{name}.png")
    return paths
