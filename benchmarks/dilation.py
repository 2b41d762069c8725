"""Time-dilated emulation against its own claims: contention, noise, invariance, modes and prediction.

Usage: python benchmarks/dilation.py [--out DIR] [--repeats 3] [--real-factor 100] [--factor 8] [--quick]
                                    [--every-strategy]

Every figure comes from real `ralp-pipe train` runs made by this script in one go (repeats go round by
round over the configurations, so slow drift of the host spreads over all of them). The target cluster
is V100s (`dilation.target=v100`, the device model) running ResNet-18 on 1000 classes at batch 32 and
224 px per worker. Two families of runs:

- *real* (`dilation.mode=real`, D = `--real-factor`, loopback, `allreduce`): each rank computes ResNet-18
  at 32 px on 2 images, then waits out D x the V100's time of each unit; N = 1, 4, 8 on this host's
  cores, each rank with one torch thread (`train.cpu_share=8`):

      ralp-pipe train --out DIR cluster=local network=loopback strategy=allreduce model=resnet18 \\
        dataset=synthetic1k train.batch_size=32 train.image_size=224 train.loader=synthetic \\
        train.cpu_share=8 train.warmup_steps=2 train.measure_steps=3 cluster.gpus=N \\
        dilation.factor=100 dilation.mode=real dilation.compute_batch_size=2 dilation.compute_image_size=32

  The same at N = 4 with `dilation.mode=modelled` (no compute_* keys), and undilated (no dilation.* keys,
  `train.batch_size=2 train.image_size=32`: the ranks' own computation, for contrast).
- *modelled* (`dilation.mode=modelled`, emulated 10 Gbit/s links shaped to 10 Gbit/s / D, N=4): `ps`,
  `allreduce`, `ralp_h` and `ralp_n` at D = `--factor`, `ps` and `allreduce` also at 2D (all four with
  `--every-strategy`), the RALP splits from the plan of the V100's modelled profile, which also predicts
  their images/sec:

      ralp-pipe profile --target v100 --out P model=resnet18 dataset=synthetic1k train.batch_size=32 \\
        train.image_size=224 cluster=emulated network=10gbit cluster.gpus=4
      ralp-pipe plan --profile P --out PLAN <the same overrides> dilation.factor=8 dilation.mode=modelled
      ralp-pipe train --out DIR --plan PLAN <the same overrides> train.loader=synthetic \\
        train.warmup_steps=2 train.measure_steps=3 strategy=S dilation.factor=8 dilation.mode=modelled

  and once `ps` with `dilation.factor=auto` (what the link check picks, and whether it overruns).

Checks, each printed with its figures and PASS/FAIL:

1. Contention gone: a worker's compute per step (median over the measured steps of worker ranks, mean
   over repeats) at N=4 and N=8 within 5% of N=1, dilated with zero overruns (undilated ratio beside).
2. Noise: 95% t half-width of target-equivalent images/sec over the repeats <= 3% of the mean, every
   dilated configuration.
3. Invariance: target-equivalent images/sec at D and 2D within 5%, every strategy run at both.
4. Modes agree: `real` and `modelled` target-equivalent images/sec within 5% (N=4, the real family).
5. Prediction: the plan's images/sec for the V100 cluster against the measured target-equivalent ones at
   D, median absolute error <= 5% over the four strategies.
6. Zero overruns in every run (each run's overruns, stalls and needed_factor are listed; a stall is a unit
   late only because the host kept its rank off every core, not an overrun).

The per-run records go to `runs.csv` and `runs.json` in `--out` (default: a new temporary folder).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ralp_pipe.results.intervals import mean_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import measured_steps  # noqa: E402

STRATEGIES = ("ps", "allreduce", "ralp_h", "ralp_n")
INVARIANCE = ("ps", "allreduce")  # also run at 2D (all four with --every-strategy)
CONTENTION_TOL, NOISE_TOL, INVARIANCE_TOL, MODES_TOL, PREDICTION_TOL = 0.05, 0.03, 0.05, 0.05, 0.05
TARGET = ["model=resnet18", "dataset=synthetic1k", "train.batch_size=32", "train.image_size=224"]
STEPS = ["train.loader=synthetic", "train.warmup_steps=2", "train.measure_steps=3"]
REAL_COMPUTE = ["dilation.compute_batch_size=2", "dilation.compute_image_size=32"]
LOOPBACK = ["cluster=local", "network=loopback", "strategy=allreduce", "train.cpu_share=8"]
EMULATED = ["cluster=emulated", "network=10gbit", "cluster.gpus=4"]


@dataclass
class Run:
    """One configuration of the benchmark (run `repeats` times) and what its runs measured."""

    name: str
    overrides: list[str]
    factor: float | None
    mode: str  # real / modelled / undilated
    strategy: str
    gpus: int
    records: list[dict[str, Any]] = field(default_factory=list)

    def mean(self, key: str) -> float:
        """Mean of `key` over the repeats that finished (NaN when none did)."""
        values = [r[key] for r in self.records if r.get(key) is not None]
        return statistics.fmean(values) if values else float("nan")

    def overruns(self) -> int:
        """Overruns summed over every repeat (a failed run counts as one)."""
        return sum(r["overruns"] if r["ok"] else 1 for r in self.records)


def train(out: Path, run: Run, repeat: int, plan: Path | None) -> dict[str, Any]:
    """One `ralp-pipe train` of `run`; its figures (ok=False with the error where it failed)."""
    argv = [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out)]
    argv += [*(["--plan", str(plan)] if plan else []), *run.overrides, f"train.repeat={repeat}"]
    began = time.monotonic()
    print(f"[{time.strftime('%H:%M:%S')}] {run.name} r{repeat}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    base = {"name": run.name, "repeat": repeat, "wall_s": time.monotonic() - began, "out": str(out)}
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  failed ({done.returncode}): {error}", file=sys.stderr)
        return {**base, "ok": False, "error": error, "overruns": None}
    metrics = json.loads((out / "metrics.json").read_text())
    steps = measured_steps(out)
    workers = steps[steps.role == "worker"]
    dilation = metrics.get("dilation") or {}
    return {
        **base,
        "ok": True,
        "factor": dilation.get("factor"),
        "mode": dilation.get("mode", "undilated"),
        "images_per_sec": metrics["images_per_sec"],
        "target_images_per_sec": metrics.get("target_images_per_sec"),
        "step_time_s": metrics["step_time_s"],
        "worker_compute_s": float(workers.compute_s.median()),
        "worker_comm_wait_s": float(workers.comm_wait_s.median()),
        "gb_per_step": metrics["gb_per_step"]["total"],
        "overruns": int(dilation.get("overruns", 0)),
        "stalls": int(dilation.get("stalls", 0)),
        "needed_factor": dilation.get("needed_factor"),
        "split": metrics.get("split"),
    }


def cli(*argv: str) -> None:
    """Run one `ralp-pipe` command, failing loudly."""
    subprocess.run([sys.executable, "-m", "ralp_pipe.cli", *argv], check=True, stdout=subprocess.DEVNULL)


def configurations(real_factor: float, factor: float, quick: bool, every: bool) -> list[Run]:
    """Every configuration the checks need."""
    real = [*TARGET, *STEPS, *LOOPBACK, f"dilation.factor={real_factor:g}"]
    runs = [
        Run(f"real N={n} D={real_factor:g}", [*real, f"cluster.gpus={n}", "dilation.mode=real", *REAL_COMPUTE],
            real_factor, "real", "allreduce", n)
        for n in (1, 4, 8)
    ]  # fmt: skip
    runs.append(
        Run(f"modelled N=4 D={real_factor:g} (loopback)", [*real, "cluster.gpus=4", "dilation.mode=modelled"],
            real_factor, "modelled", "allreduce", 4)
    )  # fmt: skip
    undilated = [
        *STEPS,
        *LOOPBACK,
        "model=resnet18",
        "dataset=synthetic1k",
        "train.batch_size=2",
        "train.image_size=32",
    ]
    runs += [
        Run(f"undilated N={n}", [*undilated, f"cluster.gpus={n}"], None, "undilated", "allreduce", n)
        for n in ((1, 4, 8) if not quick else ())
    ]
    for d in (factor, 2 * factor):
        for s in STRATEGIES if every or d == factor else INVARIANCE:
            overrides = [
                *TARGET,
                *STEPS,
                *EMULATED,
                f"strategy={s}",
                f"dilation.factor={d:g}",
                "dilation.mode=modelled",
            ]
            runs.append(Run(f"{s} 10gbit D={d:g}", overrides, d, "modelled", s, 4))
    return runs


def main() -> int:
    """Run every configuration, then print the checks and the per-run table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run folders and runs.csv/json (default: temporary)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--real-factor", type=float, default=100.0, help="D of the real-mode family")
    parser.add_argument("--factor", type=float, default=8.0, help="D of the modelled family on 10 Gbit/s (and 2D)")
    parser.add_argument("--quick", action="store_true", help="no undilated contrast, no auto run")
    parser.add_argument(
        "--every-strategy", action="store_true", help="all four strategies at 2D (6 more runs, 2-5 min here)"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ralp-dilation-"))
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    profile, plan = out / "v100.json", out / "plan.json"  # the plan prices the target: the same at every D
    cli("profile", "--target", "v100", "--out", str(profile), *TARGET, *EMULATED)
    cli("plan", "--profile", str(profile), "--out", str(plan), *TARGET, *EMULATED,
        f"dilation.factor={args.factor:g}", "dilation.mode=modelled")  # fmt: skip
    runs = configurations(args.real_factor, args.factor, args.quick, args.every_strategy)
    for repeat in range(args.repeats):
        for i, run in enumerate(runs):
            if run.mode == "undilated" and repeat > 0:
                continue  # contrast only: one repeat
            emulated = "network=10gbit" in run.overrides
            run.records.append(train(out / f"c{i:02d}" / f"r{repeat}", run, repeat, plan if emulated else None))
    auto = None
    if not args.quick:
        auto_run = Run("ps 10gbit D=auto", [*TARGET, *STEPS, *EMULATED, "strategy=ps", "dilation.factor=auto",
                       "dilation.mode=modelled"], None, "modelled", "ps", 4)  # fmt: skip
        auto = train(out / "auto", auto_run, 0, plan)
        auto_run.records.append(auto)
        runs.append(auto_run)
    wall = time.monotonic() - began
    records = [r for run in runs for r in run.records]
    pd.DataFrame(records).to_csv(out / "runs.csv", index=False)
    (out / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1, default=str))
    ok = report(runs, plan, args, auto)
    print(f"wall time {wall:.0f} s; records in {out}/runs.csv")
    return 0 if ok else 1


def verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def report(runs: list[Run], plan: Path | None, args: argparse.Namespace, auto: dict[str, Any] | None) -> bool:
    """Print the per-run table and the six checks; True when every check passed."""
    by = {r.name: r for r in runs}
    rf, f = args.real_factor, args.factor
    rows = []
    for run in runs:
        for r in run.records:
            rows.append(
                {
                    "configuration": run.name,
                    "r": r["repeat"],
                    "ok": r["ok"],
                    "D": r.get("factor"),
                    "img/s": r.get("images_per_sec"),
                    "target img/s": r.get("target_images_per_sec"),
                    "step s": r.get("step_time_s"),
                    "compute s": r.get("worker_compute_s"),
                    "comm wait s": r.get("worker_comm_wait_s"),
                    "overruns": r.get("overruns"),
                    "stalls": r.get("stalls"),
                    "needed D": r.get("needed_factor"),
                    "wall s": r["wall_s"],
                }
            )
    print("Runs (compute s, comm wait s: a worker's median over the measured steps)")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print()
    checks: list[tuple[str, str, str, bool]] = []  # check, figures, target, passed

    # 1. contention
    one = by[f"real N=1 D={rf:g}"]
    und1 = by.get("undilated N=1")
    for n in (4, 8):
        run, und = by[f"real N={n} D={rf:g}"], by.get(f"undilated N={n}")
        ratio = run.mean("worker_compute_s") / one.mean("worker_compute_s")
        contrast = und.mean("worker_compute_s") / und1.mean("worker_compute_s") if und and und1 else float("nan")
        overruns = run.overruns() + one.overruns()
        checks.append(
            (
                f"1 contention N={n}/N=1",
                f"dilated {ratio:.3f} ({run.mean('worker_compute_s'):.3f} / {one.mean('worker_compute_s'):.3f} s), "
                f"overruns {overruns}; undilated {contrast:.2f}",
                f"|ratio-1| <= {CONTENTION_TOL:.0%}, 0 overruns",
                abs(ratio - 1) <= CONTENTION_TOL and overruns == 0,
            )
        )
    # 2. noise
    for run in runs:
        if run.factor is None or len(run.records) < 2:
            continue
        values = [r["target_images_per_sec"] for r in run.records if r["ok"]]
        if len(values) < 2:
            checks.append((f"2 noise {run.name}", f"{len(values)} finished run(s)", "<= 3% of mean", False))
            continue
        e = mean_interval(values)
        checks.append(
            (
                f"2 noise {run.name}",
                f"{e.mean:.1f} +- {e.half_width:.1f} target img/s ({e.half_width / e.mean:.2%})",
                f"<= {NOISE_TOL:.0%} of mean",
                e.half_width / e.mean <= NOISE_TOL,
            )
        )
    # 3. invariance
    for s in STRATEGIES:
        low, high = by.get(f"{s} 10gbit D={f:g}"), by.get(f"{s} 10gbit D={2 * f:g}")
        if low is None or high is None:
            continue
        a, b = low.mean("target_images_per_sec"), high.mean("target_images_per_sec")
        checks.append(
            (
                f"3 invariance {s} D={f:g} vs {2 * f:g}",
                f"{a:.1f} vs {b:.1f} target img/s ({b / a - 1:+.1%})",
                f"within {INVARIANCE_TOL:.0%}",
                abs(b / a - 1) <= INVARIANCE_TOL,
            )
        )
    # 4. modes
    real, modelled = by[f"real N=4 D={rf:g}"], by[f"modelled N=4 D={rf:g} (loopback)"]
    a, b = real.mean("target_images_per_sec"), modelled.mean("target_images_per_sec")
    checks.append(
        (
            "4 modes real vs modelled N=4",
            f"{a:.1f} vs {b:.1f} target img/s ({b / a - 1:+.1%})",
            f"within {MODES_TOL:.0%}",
            abs(b / a - 1) <= MODES_TOL,
        )
    )
    # 5. prediction
    if plan is not None:
        entries = json.loads(plan.read_text())["strategies"]
        predicted = {s: float(entries[s]["predicted_images_per_sec"]) for s in STRATEGIES}
        errors = []
        for s in STRATEGIES:
            measured = by[f"{s} 10gbit D={f:g}"].mean("target_images_per_sec")
            errors.append((predicted[s] - measured) / measured)
            checks.append(
                (
                    f"5 prediction {s} D={f:g}",
                    f"predicted {predicted[s]:.1f}, measured {measured:.1f} target img/s ({errors[-1]:+.1%})",
                    "(row of the median)",
                    True,
                )
            )
        median = statistics.median(abs(e) for e in errors)
        checks.append(
            (
                "5 prediction median |error|",
                f"{median:.1%} over {len(errors)} strategies",
                f"<= {PREDICTION_TOL:.0%}",
                median <= PREDICTION_TOL,
            )
        )
    # 6. overruns
    checked = [r for r in runs if r.factor is not None and r.name != "ps 10gbit D=auto"]
    total = sum(r.overruns() for r in checked)
    stalls = sum(x.get("stalls") or 0 for r in checked for x in r.records)
    worst = max((x.get("needed_factor") or 0.0, r.name) for r in checked for x in r.records)
    checks.append(
        (
            "6 overruns, every dilated run",
            f"{total} in {sum(len(r.records) for r in checked)} runs ({stalls} stalls); largest needed D "
            f"{worst[0]:.3g} ({worst[1]})",
            "0",
            total == 0,
        )
    )
    if auto is not None:
        checks.append(
            (
                "6 dilation.factor=auto (ps)",
                f"chose D={auto.get('factor')}, overruns {auto.get('overruns')}, stalls {auto.get('stalls')}, needed D "
                f"{auto.get('needed_factor') or 0:.3g}, target img/s {auto.get('target_images_per_sec') or 0:.1f}",
                "0 overruns",
                bool(auto["ok"]) and auto["overruns"] == 0,
            )
        )
    width = max(len(c[0]) for c in checks)
    figures = max(len(c[1]) for c in checks)
    print(f"{'check':<{width}}  {'figures':<{figures}}  {'target':<28} result")
    for name, text, target, passed in checks:
        print(f"{name:<{width}}  {text:<{figures}}  {target:<28} {verdict(passed) if target[0] != '(' else ''}")
    return all(c[3] for c in checks)


if __name__ == "__main__":
    raise SystemExit(main())
