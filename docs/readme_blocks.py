"""The README's paragraphs and tables that carry measured figures, written from their records (``make docs``).

Each function returns one block of README.md, whose marker names it; the figures come from ``docs/records/``
through :mod:`records`, so a record measured again changes the README by regeneration only.
"""

from __future__ import annotations

import records as r

from ralp_pipe.config import load
from ralp_pipe.config.dilation import transport_efficiency


def headline() -> str:
    """The headline figure's caption, the paper-dilated matrix's fit and its speedups at N = 8."""
    m, p = "paper-dilated", "headline-predicted"
    cap = load(["strategy=dtf"]).strategy.transport_cap or "unlimited"
    shares = " / ".join(f"{transport_efficiency(f'{rate}gbit', cap):.2f}" for rate in (1, 10, 25))
    text = r.wrap(f"""*Predicted by the planner* (the cost model on modelled V100 profiles, batch 32, 224 px, N = 8; drawn
        by `{r.value_of(p, "command")}` at revision {r.value_of(p, "revision")}). Three baselines, as each system
        deploys them: `dtf` is Distributed TensorFlow as the paper measured it (a PS task beside every worker, each
        variable whole on one task, gRPC costing every byte the link's time plus its own: {cap.replace("gbit", " Gbit/s")}
        alone, read from TensorFlow's 2017 figure, so {shares} of the link at 1 / 10 / 25 Gbit/s, and
        TensorFlow's step-end barrier: no variable comes back before every push of the step is applied); `ps` one dedicated parameter server with tensors
        partitioned and pipelined (BytePS-style, the strongest PS); `allreduce` a ring. The paper-dilated matrix,
        measured here by time-dilated emulation against `ps` and `allreduce` (its N <= 8 part at 2 + 3 steps:
        {r.fig(m, "runs")} runs, {r.minutes(r.value(m, "wall_s"))} on 2 cores, at revision {r.value_of(m, "revision")}),
        **matched the predictions within {r.fig(m, "median_miss_pct")}% median** ({r.fig(m, "configurations")}
        configurations, the largest miss {r.fig(m, "largest_miss_pct")}%); `dtf`, priced as a timeline of every
        variable's transfers, is within 1% of its own emulation on AlexNet/1K (N = 2, 4) and on hosts of 4 ([time
        dilation](docs/method/dilation.md#emulated-hosts-of-several-gpus)). Speedups at N = 8:""")
    header = [
        "model / classes",
        "RALP-N over `ps`, measured, at 1 / 10 / 25 Gbit/s",
        "over `allreduce`, measured",
        "over `dtf`, predicted",
    ]
    return text + "\n\n" + r.table(header, r.speedup_rows()) + "\n"


def hosts() -> str:
    """The hosts-dilated experiment's speedups and prediction error."""
    h = "hosts-dilated"
    return (
        r.wrap(f"""The gain grows with the classifier's share of the parameters and shrinks as the link gets faster,
        the paper's shape; RALP loses to all-reduce only on ResNet-50. On hosts of 4 GPUs sharing one 10 Gbit/s link
        (`experiment=hosts-dilated`, N = 8, measured, {r.minutes(r.value(h, "wall_s"))} here), RALP-H is
        {r.fig(h, "vgg16_22k.ralp_h_over_dtf")}x `dtf` and {r.num(r.value(h, "vgg16_22k.ralp_h_over_byteps"))}x
        `byteps` (a PS on every host) on VGG-16/22K (`dtf` as it ran at revision {r.value_of(h, "revision")}: gRPC at
        0.67 of the rate, no step-end barrier), {r.fig(h, "resnet50_22k.ralp_h_over_dtf")}x and
        {r.fig(h, "resnet50_22k.ralp_h_over_byteps")}x on ResNet-50/22K, the predictions within
        {r.fig(h, "median_miss_pct")}% median, {r.fig(h, "worst_miss_pct")}% at worst.""")
        + "\n"
    )


def steps() -> str:
    """How many measured steps are within 1% of the paper's 5 + 100, and the table it is chosen from."""
    worst = r.value("steps", "worst_deviation_pct")
    fewest = min((k for k, v in worst.items() if v <= 1 and k.startswith("1+")), key=lambda k: int(k[2:]))
    text = r.wrap(f"""How many steps the paper's 100-step figure needs (`benchmarks/steps.py`: one 5 + 100-step run per
        strategy and mode, ResNet-18/1K, N = 4, 10 Gbit/s; worst deviation over the 8 runs of a w + k-step run or its
        typical k-step window; revision {r.value_of("steps", "revision")}): **1 warm-up + {fewest[2:]} steps is the
        fewest within 1%**, so `paper-dilated` measures 1 + 25 and `paper-dilated-100` the paper's 5 + 100; the
        default `make run` keeps 1 + 2 (within {r.num(worst["1+2"])}%) to fit its ten minutes ([how many
        steps](docs/results.md#how-many-steps)).""")
    header = ["warm-up + measured steps", *(k.replace("+", " + ") for k in worst)]
    return (
        text + "\n\n" + r.table(header, [["worst deviation from 5 + 100", *(f"{r.num(v)}%" for v in worst.values())]])
    )


def make_run() -> str:
    """What `make run` runs and how long it took from a fresh clone."""
    t = "make-run-time"
    total = [a + b for a, b in zip(r.value(t, "setup_s"), r.value(t, "workflow_s"))]
    return (
        r.wrap(f"""`make run` runs the `dilated` experiment ({r.minutes(min(total))} - {r.minutes(max(total))} on a
        fresh clone in {len(total)} runs, 2 cores, set-up included; no dataset needed): a cluster of V100s emulated
        time-dilated on this machine (every layer waits 8 x its V100 time, links run at their rate / 8), every stage
        for real. It prepares shards of a synthetic ImageNet-1K, profiles this machine beside the V100 model, and
        trains ResNet-18/1K at N = 2 and 4 on 10 Gbit/s with the single-device reference, and AlexNet/1K at N = 2 on
        10 and 5 Gbit/s; all four strategies (RALP-H at N = 4 only: at N = 2 it is RALP-N), one ResNet-18
        configuration also computing for real (reading the shards through DALI) beside its modelled twin, and
        concurrent jobs sharing the PS link (`ps` beside RALP-N, and each beside itself); 2 repeats. Snakemake prints
        each job as it runs; everything is written under `results/`:""")
        + "\n"
    )


def default_figures() -> str:
    """What the default's bundle showed: speedups, real against modelled, concurrent slowdowns."""
    d = "default-run"
    real = r.value(d, "real_vs_modelled_pct")
    lo, hi = r.value(d, "resnet18_ralp_n_over_ps")
    alone = r.value(d, "concurrent_slowdown.ralp_n_beside_itself")
    return (
        r.wrap(f"""There, AlexNet's RALP is about {r.fig(d, "alexnet_ralp_over_ps.10gbit")}x its pipelined `ps` at
        10 Gbit/s and {r.fig(d, "alexnet_ralp_over_ps.5gbit")}x at 5 (`ps` moves {r.fig(d, "alexnet_ps_gb_per_step")}
        GB a step through one link) and ResNet-18's RALP-N {lo}-{hi}x `ps`, while `allreduce` beats RALP on
        ResNet-18; real computation ran within 1-3% of its model ({", ".join(f"{m:.1f} ± {h:.1f}%" for m, h in real)}
        in the {len(real)} latest runs). Two jobs on one PS link: `ps` slows
        {r.fig(d, "concurrent_slowdown.ps_beside_itself")}x beside itself, RALP-N {alone[0]}-{alone[1]}x; mixed, `ps`
        {r.fig(d, "concurrent_slowdown.ps_beside_ralp_n")}x and RALP-N
        {r.fig(d, "concurrent_slowdown.ralp_n_beside_ps")}x.""")
        + "\n"
    )


def published() -> str:
    """The published-cluster check: the model's scaling-efficiency misses beside predicting perfect scaling."""
    p = "published"
    overall = r.value(p, "overall")
    goal = overall["model_median"] <= overall["perfect_median"] / 2 and overall["model_worst"] <= 15
    if goal:
        verdict = "the model's median miss is at most half of that and its worst at most 15 points: it has skill"
    elif overall["model_median"] < overall["perfect_median"]:
        verdict = (
            "the model beats that, but not yet by the goal (a median at most half of perfect scaling's, the worst"
            " at most 15 points); it gains most on the multi-host Distributed TensorFlow rows and nothing yet on"
            " one host of K80s, where it predicts perfect scaling"
        )
    else:
        verdict = "overall the model does not beat that, so it has no skill on these rows yet"
    text = r.wrap(f"""Beside TensorFlow's published multi-GPU figures (`python benchmarks/published.py`,
        {overall["rows"]} rows, 2-64 GPUs, revision {r.value_of(p, "revision")}), predicted scaling efficiency is within
        {overall["model_median"]:.1f} points median and {overall["model_worst"]:.1f} at worst. Predicting perfect
        scaling (100%) for every row misses by {overall["perfect_median"]:.1f} and {overall["perfect_worst"]:.1f}:
        {verdict} ([why](docs/results.md#against-published-clusters)):""")
    rows = [
        [g["cluster"], f"`{g['strategy']}`", g["rows"], f"{g['model_median']:.1f} / {g['model_worst']:.1f}",
         f"{g['perfect_median']:.1f} / {g['perfect_worst']:.1f}"]
        for g in r.value(p, "groups")
    ]  # fmt: skip
    header = ["published cluster", "strategy", "rows", "model's miss, median / worst (points)", "perfect scaling's"]
    return text + "\n\n" + r.table(header, rows) + "\n"
