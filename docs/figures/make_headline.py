"""Draw the README's headline figure: the planner's predicted RALP speedups of the paper-dilated matrix.

    python docs/figures/make_headline.py [--out docs/figures/headline_predicted.png] [--gpus 8] [--record R]

For every (model, dataset) of ``experiment=paper-dilated`` it models the experiment's target GPU
(``experiment.target``) at the experiment's batch and image size, prices every strategy at N = `--gpus` on
each of the experiment's link rates with the simulator's cost model (``ralp-pipe simulate``'s
:func:`~ralp_pipe.planning.simulate.simulate`, `ps` deployed as the experiment runs it: ``strategy.num_ps``
and ``strategy.ps_placement``; `dtf` as ``config/strategy/dtf.yaml`` deploys Distributed TensorFlow: one PS task
per host, each variable whole on one task, over gRPC) and plots RALP-N's and RALP-H's speedup over `dtf`, over
`ps` and over `allreduce` against the link rate, as ``results/plots.py``'s ``speedup_vs_link`` draws a measured matrix.
These are predictions, not measurements. ``--record`` also writes RALP-N's predicted speedups over each
baseline per row and link rate as a docs record (``docs/records/headline-predicted.json``, the README's `dtf`
column).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ralp_pipe.atomic import atomic_path
from ralp_pipe.config import load
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.engine import devicemodel, models
from ralp_pipe.planning.planner import dtf_options, pipelining_of, whole_variables
from ralp_pipe.planning.profiling import profile_batches
from ralp_pipe.planning.simulate import Grid, Servers, simulate
from ralp_pipe.results.plots import HEADLINE_STYLES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from record import write_record  # noqa: E402

EXPERIMENT = "paper-dilated"
MODEL_NAMES = {"vgg11": "VGG-11", "vgg16": "VGG-16", "resnet50": "ResNet-50"}
CLASSES = {"synthetic1k": "1K", "synthetic22k": "22K"}
DEFAULT_OUT = Path(__file__).resolve().parent / "headline_predicted.png"
SPEEDUP_TICKS = (0.2, 0.3, 0.5, 1, 2, 3, 5, 10, 20, 30, 50, 100, 200)  # labelled ticks of the logarithmic speedup axes


def predictions(gpus: int) -> pd.DataFrame:
    """The simulator's rows for every (model, dataset) of the experiment at `gpus` on each of its link rates."""
    matrix = load([f"experiment={EXPERIMENT}"])
    target = matrix.experiment.target or matrix.dilation.target
    frames = []
    for dataset in matrix.experiment.datasets:
        for model in matrix.experiment.models:
            cfg = load(
                devicemodel.target_overrides(
                    target, [f"experiment={EXPERIMENT}", f"model={model}", f"dataset={dataset}"]
                )
            )
            links = [
                rate_bits_per_s(load([f"network={name}"]).network.rate) / 1e9 for name in matrix.experiment.networks
            ]
            profile = devicemodel.modelled_profile(cfg, profile_batches(cfg.train.batch_size, [gpus]), gpus)
            units = models.placement_units(models.build(model, cfg.dataset.num_classes, cfg.model.dropout))
            servers = Servers(cfg.strategy.num_ps, cfg.strategy.ps_placement == "colocated", False, pipelining_of(cfg))
            variables = whole_variables(units, dtf_options(cfg))
            frame = simulate(profile, units, cfg.train.batch_size, Grid([gpus], links), servers, variables=variables)
            frames.append(frame.assign(dataset=dataset, device=cfg.device.name.upper()))
    return pd.concat(frames, ignore_index=True)


BASELINE_LABELS = {  # each panel's baseline, named with its PS count and placement as the matrix deploys it
    "dtf": "dtf (Distributed TensorFlow: a PS task on every host, whole variables, gRPC)",
    "ps": "ps (1 dedicated PS, tensors partitioned, pipelined)",
    "allreduce": "allreduce (ring, NCCL-style)",
}


def draw(frame: pd.DataFrame, path: Path, caption: str) -> None:
    """RALP-N and RALP-H over each of :data:`BASELINE_LABELS` against the link rate, both axes logarithmic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    from matplotlib.lines import Line2D

    rate = frame.set_index(["model", "dataset", "gpus", "link_gbit", "strategy"])["images_per_sec"]
    fig, axes = plt.subplots(1, len(BASELINE_LABELS), figsize=(17, 4.8))
    colours = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # a ListedColormap
    groups = list(frame.groupby(["model", "dataset", "gpus"], sort=True))
    links = sorted(frame["link_gbit"].unique())
    for axis, baseline in zip(axes, BASELINE_LABELS):
        for index, ((model, dataset, gpus), _) in enumerate(groups):
            for strategy, (_, linestyle, marker, filled) in HEADLINE_STYLES.items():
                speedup = [
                    rate[(model, dataset, gpus, link, strategy)] / rate[(model, dataset, gpus, link, baseline)]
                    for link in links
                ]
                colour = colours[index % len(colours)]
                axis.plot(
                    links,
                    speedup,
                    color=colour,
                    linestyle=linestyle,
                    marker=marker,
                    markerfacecolor=colour if filled else "none",
                )
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(links, labels=[f"{link:g}" for link in links])
        axis.xaxis.set_minor_locator(ticker.NullLocator())
        axis.yaxis.set_major_locator(ticker.FixedLocator(SPEEDUP_TICKS))
        axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}x"))
        axis.yaxis.set_minor_formatter(ticker.NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
        axis.set(xlabel="target link rate (Gbit/s)", ylabel=f"predicted speedup over {baseline}")
        axis.set_title(BASELINE_LABELS[baseline], fontsize="small")
    handles = [
        Line2D([], [], color=colours[i % len(colours)], label=f"{model}/{dataset} N={gpus}")
        for i, ((model, dataset, gpus), _) in enumerate(groups)
    ]
    handles += [
        Line2D([], [], color="grey", linestyle=ls, marker=mk, markerfacecolor="grey" if filled else "none", label=name)
        for name, ls, mk, filled in HEADLINE_STYLES.values()
    ]
    axes[-1].legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"RALP speedup vs link rate, {frame['device'].iloc[0]} cluster (modelled): predicted by the planner")
    fig.text(0.01, 0.01, caption, fontsize="small", color="0.3")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def ralp_n_speedups(frame: pd.DataFrame) -> list[dict[str, object]]:
    """RALP-N's predicted speedup over each baseline, one row per (model, classes), a figure per link rate."""
    rate = frame.pivot_table(index=["model", "dataset", "link_gbit"], columns="strategy", values="images_per_sec")
    rows = []
    for (model, dataset), part in rate.groupby(level=["model", "dataset"], sort=False):
        row: dict[str, object] = {"row": f"{MODEL_NAMES.get(model, model)} / {CLASSES.get(dataset, dataset)}"}
        row["links_gbit"] = [float(link) for link in part.index.get_level_values("link_gbit")]
        for baseline in BASELINE_LABELS:
            row[f"ralp_n_over_{baseline}"] = [round(float(v), 3) for v in part["ralp_n"] / part[baseline]]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG to write")
    parser.add_argument("--gpus", type=int, default=8, help="N, the cluster's GPUs (the matrix's largest: 8)")
    parser.add_argument("--revision", default="", help="the git revision named in the figure's caption")
    parser.add_argument("--record", type=Path, help="also write RALP-N's speedups as a docs record (JSON)")
    args = parser.parse_args()
    frame = predictions(args.gpus)
    if args.record:  # before the figure is redrawn, so the record's revision is the checkout's as it was
        note = f"RALP-N's predicted speedups at N = {args.gpus} over each baseline, one figure per link rate."
        write_record(args.record, {"gpus": args.gpus, "speedups": ralp_n_speedups(frame)}, note)
    revision = f" at {args.revision}" if args.revision else ""
    caption = f"drawn by python docs/figures/make_headline.py{revision}; cost-model predictions, not measurements"
    draw(frame, args.out, caption)
    rate = frame.pivot_table(
        index=["model", "dataset", "gpus", "link_gbit"], columns="strategy", values="images_per_sec"
    )
    speedups = pd.DataFrame(
        {f"{s} / {base}": rate[s] / rate[base] for s in HEADLINE_STYLES for base in BASELINE_LABELS}
    )
    print(speedups.round(2).to_string())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
