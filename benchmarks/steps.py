"""How many steps give the paper's 100-step figure: k measured steps (after w warm-ups) against 5 + 100.

Usage: python benchmarks/steps.py [--out DIR] [--factor 8] [--real-factor 8] [--warmup 5] [--steps 100]
                                  [--modes modelled real] [--tolerance 0.01] [--long]

One long `ralp-pipe train` per strategy (ps, allreduce, ralp_h, ralp_n) and dilation mode (modelled: no rank
computes, each layer unit waits D x its V100 time; real: each rank computes ResNet-18 on 2 images at 32 px, then
pads to D x the V100's time) of the default's configuration: ResNet-18 on 1000 classes, N = 4 V100s on a
10 Gbit/s emulated link, batch 32 at 224 px per worker, D = 8, the RALP splits from the plan of the V100's
modelled profile:

    ralp-pipe profile --target v100 --out P model=resnet18 dataset=synthetic1k train.batch_size=32 \\
      train.image_size=224 cluster=emulated network=10gbit cluster.gpus=4
    ralp-pipe plan --profile P --out PLAN <the same overrides> dilation.factor=8 dilation.mode=modelled
    ralp-pipe train --out DIR --plan PLAN <the same overrides> train.loader=synthetic train.warmup_steps=5 \\
      train.measure_steps=100 strategy=S dilation.factor=D dilation.mode=M [real: dilation.compute_batch_size=2
      dilation.compute_image_size=32]

Each run's steps.parquet gives every step's time (the mean over the worker ranks of that step's wall time), so
every shorter recipe is a window of the one run: the target-equivalent images/sec of k steps after w warm-ups is
images per step x D x k / (the sum of steps w .. w + k - 1). The reference is the paper's recipe, the 100 steps
after 5 warm-ups (its 95% interval from 10 batch means of 10 steps: neighbouring steps are not independent).
For each k (2, 3, 5, 10, 25) and w (1, 2, 5) the table shows:

- prefix: what a run of w warm-ups and k measured steps would have reported, and its deviation from 100 steps;
- windows: the same figure over every disjoint k-step window of steps w .. 104 (a k-step measurement taken at
  another moment), the root-mean-square deviation of those windows from the 100-step figure (the typical error
  of a k-step run) and the 95% interval of their mean.

The choice: the smallest k, then the smallest w, whose prefix AND windows' RMS deviation are within
`--tolerance` (1%) of the 100-step figure for every strategy and mode. Per-run records go to `steps.csv` in
`--out` (default: a new temporary folder).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ralp_pipe.results.intervals import mean_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_record  # noqa: E402

STRATEGIES = ("ps", "allreduce", "ralp_h", "ralp_n")
KS = (2, 3, 5, 10, 25)  # measured steps of the shorter recipes
WARMUPS = (1, 2, 5)  # warm-up steps before them
BATCHES = 10  # batch means of the reference's interval
TARGET = ["model=resnet18", "dataset=synthetic1k", "train.batch_size=32", "train.image_size=224"]
EMULATED = ["cluster=emulated", "network=10gbit", "cluster.gpus=4"]
REAL_COMPUTE = ["dilation.compute_batch_size=2", "dilation.compute_image_size=32"]


@dataclass(frozen=True)
class Recipe:
    """k measured steps after w warm-ups."""

    warmup: int
    steps: int

    def __str__(self) -> str:
        return f"{self.warmup}+{self.steps}"


def step_times(steps: pd.DataFrame) -> list[float]:
    """Every step's time in step order (warm-ups included): the mean over the worker ranks of that step's wall
    time (steps.parquet's rows of role ``worker``)."""
    workers = steps[steps.role == "worker"]
    if workers.empty:
        raise ValueError("steps table has no worker rows")
    return [float(t) for t in workers.groupby("step").step_time_s.mean().sort_index()]


def figure(times: Sequence[float], start: int, k: int, images_per_step: float, factor: float) -> float:
    """Target-equivalent images/sec of the `k` steps from `start`: images per step x D x k / their summed time."""
    if start < 0 or k < 1 or start + k > len(times):
        raise ValueError(f"window {start}..{start + k - 1} is outside the {len(times)} steps")
    return images_per_step * factor * k / sum(times[start : start + k])


def reference(
    times: Sequence[float], warmup: int, steps: int, images_per_step: float, factor: float
) -> tuple[float, float]:
    """The figure of the `steps` steps after `warmup` and the 95% half-width of its batch means."""
    value = figure(times, warmup, steps, images_per_step, factor)
    size = steps // BATCHES
    means = [figure(times, warmup + b * size, size, images_per_step, factor) for b in range(BATCHES)] if size else []
    half = mean_interval(means).half_width if len(means) > 1 else math.nan
    return value, half


def windows(times: Sequence[float], recipe: Recipe, end: int, images_per_step: float, factor: float) -> list[float]:
    """The figures of every disjoint `recipe.steps`-step window from step `recipe.warmup` to step `end` - 1."""
    k = recipe.steps
    return [figure(times, s, k, images_per_step, factor) for s in range(recipe.warmup, end - k + 1, k)]


def recipe_rows(
    times: Sequence[float],
    images_per_step: float,
    factor: float,
    ref: Recipe,
    ks: Sequence[int] = KS,
    warmups: Sequence[int] = WARMUPS,
) -> list[dict[str, Any]]:
    """One row per shorter recipe (w + k) of one run: its prefix and windows against the `ref` figure."""
    end = ref.warmup + ref.steps
    full, full_half = reference(times, ref.warmup, ref.steps, images_per_step, factor)
    rows = []
    for w in warmups:
        for k in ks:
            recipe = Recipe(w, k)
            prefix = figure(times, w, k, images_per_step, factor)
            spread = windows(times, recipe, end, images_per_step, factor)
            deviations = [v / full - 1 for v in spread]
            interval = mean_interval(spread) if len(spread) > 1 else None
            rows.append(
                {
                    "recipe": str(recipe),
                    "warmup": w,
                    "k": k,
                    "reference": full,
                    "reference_half": full_half,
                    "prefix": prefix,
                    "prefix_dev": prefix / full - 1,
                    "windows": len(spread),
                    "window_mean": interval.mean if interval else math.nan,
                    "window_half": interval.half_width if interval else math.nan,
                    "window_rms": math.sqrt(sum(d * d for d in deviations) / len(deviations))
                    if deviations
                    else math.nan,
                }
            )
    return rows


def choose(table: pd.DataFrame, tolerance: float) -> Recipe | None:
    """The smallest k, then the smallest w, whose prefix and windows' RMS deviation are within `tolerance` of the
    reference in every run of `table` (rows of :func:`recipe_rows` with a ``run`` column); None when none is."""
    for k in sorted(table.k.unique()):
        for w in sorted(table.warmup.unique()):
            rows = table[(table.k == k) & (table.warmup == w)]
            ok = (rows.prefix_dev.abs() <= tolerance) & (rows.window_rms.fillna(math.inf) <= tolerance)
            if not rows.empty and bool(ok.all()):
                return Recipe(int(w), int(k))
    return None


def cli(*argv: str) -> None:
    """Run one `ralp-pipe` command, failing loudly."""
    subprocess.run([sys.executable, "-m", "ralp_pipe.cli", *argv], check=True, stdout=subprocess.DEVNULL)


def train(out: Path, plan: Path, strategy: str, mode: str, factor: float, ref: Recipe) -> dict[str, Any]:
    """One long run; its metrics.json plus the per-step times (kept when `out` already holds a finished run)."""
    if not (out / "metrics.json").exists():
        overrides = [*TARGET, *EMULATED, "train.loader=synthetic", f"train.warmup_steps={ref.warmup}"]
        overrides += [f"train.measure_steps={ref.steps}", f"strategy={strategy}", f"dilation.factor={factor:g}"]
        overrides += [f"dilation.mode={mode}", *(REAL_COMPUTE if mode == "real" else [])]
        print(f"[{time.strftime('%H:%M:%S')}] {strategy} {mode} D={factor:g}", file=sys.stderr, flush=True)
        argv = [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), "--plan", str(plan), *overrides]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{strategy} {mode} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["times"] = step_times(pd.read_parquet(out / "steps.parquet"))
    return metrics


def main() -> int:
    """Run every strategy and mode once, then print the table and the choice."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run folders and steps.csv (default: temporary)")
    parser.add_argument("--factor", type=float, default=8.0, help="D of the modelled runs")
    parser.add_argument("--real-factor", type=float, default=8.0, help="D of the real runs")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps of the reference (the paper's 5)")
    parser.add_argument("--steps", type=int, default=100, help="measured steps of the reference (the paper's 100)")
    parser.add_argument("--modes", nargs="+", default=["modelled", "real"], choices=["modelled", "real"])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--tolerance", type=float, default=0.01, help="the choice's largest relative deviation")
    parser.add_argument("--long", action="store_true", help="also every row with its windows' mean and interval")
    parser.add_argument("--record", type=Path, help="also write the worst deviations as a docs record (JSON)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ralp-steps-"))
    out.mkdir(parents=True, exist_ok=True)
    ref = Recipe(args.warmup, args.steps)
    began = time.monotonic()
    profile, plan = out / "v100.json", out / "plan.json"
    if not plan.exists():
        cli("profile", "--target", "v100", "--out", str(profile), *TARGET, *EMULATED)
        cli("plan", "--profile", str(profile), "--out", str(plan), *TARGET, *EMULATED,
            f"dilation.factor={args.factor:g}", "dilation.mode=modelled")  # fmt: skip
    rows, runs = [], []
    for mode in args.modes:
        factor = args.factor if mode == "modelled" else args.real_factor
        for strategy in args.strategies:
            m = train(out / f"{mode}-{strategy}", plan, strategy, mode, factor, ref)
            dilation = m.get("dilation") or {}
            times = m["times"]
            run = f"{strategy} {mode}"
            full = figure(times, ref.warmup, ref.steps, m["images_per_step"], factor)
            runs.append(
                {
                    "run": run,
                    "D": factor,
                    "target img/s (metrics.json)": m["target_images_per_sec"],
                    "per-step figure / metrics.json": full / m["target_images_per_sec"],
                    "overruns": dilation.get("overruns"),
                    "stalls": dilation.get("stalls"),
                }
            )
            rows += [{"run": run, **r} for r in recipe_rows(times, m["images_per_step"], factor, ref)]
    table = pd.DataFrame(rows)
    table.to_csv(out / "steps.csv", index=False)
    wall = time.monotonic() - began
    report(table, pd.DataFrame(runs), ref, args.tolerance, args.long)
    print(f"wall time {wall:.0f} s; records in {out}/steps.csv")
    if args.record:
        worst = worst_deviations(table)
        write_record(args.record, {"worst_deviation_pct": {k: round(100 * v, 2) for k, v in worst.items()}})
    return 0


def worst_deviations(table: pd.DataFrame) -> dict[str, float]:
    """recipe w + k -> its worst deviation over every run (max of |prefix| and windows' RMS), in recipe order."""
    worst = table.assign(worst=table[["prefix_dev", "window_rms"]].abs().max(axis=1))
    by_recipe = worst.pivot_table(index="recipe", values="worst", aggfunc="max").worst
    order = sorted(by_recipe.index, key=lambda name: tuple(int(x) for x in name.split("+"))[::-1])
    return {recipe: float(by_recipe[recipe]) for recipe in order}


def report(table: pd.DataFrame, runs: pd.DataFrame, ref: Recipe, tolerance: float, long: bool) -> None:
    """Print the runs, each recipe's deviations per run (Markdown; `long`: every row's figures too) and the choice."""
    print("Runs (the per-step figure of the reference window against the run's own metrics.json)")
    print(runs.to_markdown(index=False, floatfmt=".4g"))
    print()
    references = table.drop_duplicates("run").set_index("run")
    print(f"The reference, {ref}: target-equivalent images/sec ± 95% half-width from {BATCHES} batch means")
    print("  " + "; ".join(f"{run} {r.reference:.1f} ± {r.reference_half:.1f}" for run, r in references.iterrows()))
    print()
    print(
        f"k steps after w warm-ups against {ref}, per run: the prefix's deviation (a run of w + k steps) / the RMS "
        f"deviation of every disjoint k-step window after w (the typical error of a k-step run), in %"
    )
    cells = table.assign(cell=[f"{100 * p:+.2f} / {100 * r:.2f}" for p, r in zip(table.prefix_dev, table.window_rms)])
    order = sorted(table.recipe.unique(), key=lambda name: tuple(int(x) for x in name.split("+"))[::-1])
    grid = cells.pivot(index="recipe", columns="run", values="cell").reindex(order)[list(references.index)]
    print(grid.rename_axis("w + k").to_markdown())
    if long:
        lines = ["| run | reference | w + k | prefix (dev) | windows: mean ± 95% | RMS dev | n |"]
        lines.append("|---|---|---|---|---|---|---|")
        for r in table.itertuples():
            lines.append(
                f"| {r.run} | {r.reference:.1f} ± {r.reference_half:.1f} | {r.recipe} | {r.prefix:.1f} "
                f"({100 * r.prefix_dev:+.2f}%) | {r.window_mean:.1f} ± {r.window_half:.1f} | "
                f"{100 * r.window_rms:.2f}% | {r.windows} |"
            )
        print()
        print("\n".join(lines))
    print()
    print("Worst deviation over every run (max of |prefix| and windows' RMS) per recipe w + k")
    worst = sorted(worst_deviations(table).items(), key=lambda item: item[1])
    print("\n".join(f"  {recipe}: {100 * v:.2f}%" for recipe, v in worst))
    chosen = choose(table, tolerance)
    if chosen is None:
        print(f"choice: no recipe with k <= {table.k.max()} is within {100 * tolerance:g}% for every strategy")
    else:
        print(
            f"choice: warmup_steps={chosen.warmup} measure_steps={chosen.steps} (the smallest k, then w, within "
            f"{100 * tolerance:g}% of {ref} for every strategy and mode)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
