"""Training runs side by side: the same modelled runs alone and two at a time, in one run of this script.

Usage: python benchmarks/side_by_side.py [--out DIR] [--repeats 2] [--steps 10] [--no-check] [--records RUNS_JSON]

Four `dilation.mode=modelled` ResNet-50 runs (V100s, batch 32 at 224 px per worker, 1000 classes), each with its
own fixed D: `ps` and `allreduce` at N = 2 on 1 Gbit/s (D = 1) and `ps` at N = 2 and `allreduce` at N = 4 on
10 Gbit/s (D = 16), each

    ralp-pipe train --out DIR experiment=dilated model=resnet50 strategy=S cluster.gpus=N network=R \\
      dilation.factor=D train.warmup_steps=1 train.measure_steps=10 train.repeat=K

First (unless --no-check) the link check certifies each run's D beside the rest of the workflow's side-by-side
budget (:data:`ralp_pipe.workflow.resources.LINK_BUDGET`): `accurate_factor` with that D as its only candidate
and `budget`. Then, round by round (`--repeats`), every run alone, then the pairs (1 Gbit/s together,
10 Gbit/s together: each pair's links take less than the budget), both runs of a pair started at once.

Printed per run: target-equivalent images/sec alone and beside its partner (mean and 95% t half-width over
the repeats), their difference (beside / alone - 1, its 95% delta-method interval), overruns and stalls
summed over the repeats, and the CPU the run's command used (user + system of its process tree over its wall
time, as cores, and per rank: what ralp_pipe.workflow.resources charges) beside what the accounting declares;
then the wall time of the runs alone against the pairs. Records go to `runs.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ralp_pipe.config import load
from ralp_pipe.contract.topology import links_of, of_strategy
from ralp_pipe.results.intervals import mean_interval, ratio_interval
from ralp_pipe.runtime.linkcheck import accurate_factor
from ralp_pipe.workflow.resources import LINK_BUDGET, train_demand


@dataclass(frozen=True)
class Run:
    """One configuration: its name, overrides and the D it runs at."""

    name: str
    overrides: tuple[str, ...]
    factor: float


def configurations(steps: int) -> list[Run]:
    """The four runs (module doc)."""
    common = ("experiment=dilated", "model=resnet50", "train.warmup_steps=1", f"train.measure_steps={steps}")
    table = [("ps", 2, "1gbit", 1.0), ("allreduce", 2, "1gbit", 1.0), ("ps", 2, "10gbit", 16.0),
             ("allreduce", 4, "10gbit", 16.0)]  # fmt: skip
    return [
        Run(
            f"{strategy} N={gpus} {network} D={factor:g}",
            (
                *common,
                f"strategy={strategy}",
                f"cluster.gpus={gpus}",
                f"network={network}",
                f"dilation.factor={factor:g}",
            ),
            factor,
        )
        for strategy, gpus, network, factor in table
    ]


def start(out: Path, run: Run, repeat: int) -> subprocess.Popen[bytes]:
    """Start one `ralp-pipe train` of `run` into `out` (its log beside it)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *run.overrides, f"train.repeat={repeat}"]
    with open(out / "train.log", "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def finish(
    proc: subprocess.Popen[bytes], ended: tuple[int, Any, float], out: Path, run: Run, began: float, alone: bool
) -> dict[str, Any]:
    """Read the figures of `proc`, which ended as `ended` (wait status, its process tree's rusage, time)."""
    status, usage, at = ended
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = at - began
    record: dict[str, Any] = {"name": run.name, "alone": alone, "out": str(out), "wall_s": wall}
    record["cores"] = (usage.ru_utime + usage.ru_stime) / wall
    if proc.returncode != 0:
        return record | {"ok": False, "error": (out / "train.log").read_text().strip().splitlines()[-1:]}
    metrics = json.loads((out / "metrics.json").read_text())
    dilation = metrics["dilation"]
    return record | {
        "ok": True,
        "target_images_per_sec": metrics["target_images_per_sec"],
        "overruns": int(dilation.get("overruns", 0)),
        "stalls": int(dilation.get("stalls", 0)),
        "late_s": float(dilation.get("late_s", 0.0)),
    }


def together(root: Path, runs: list[Run], repeat: int, alone: bool) -> list[dict[str, Any]]:
    """Start `runs` at once and wait for all; their records."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] r{repeat} {'alone' if alone else 'beside'}: {' | '.join(r.name for r in runs)}", file=sys.stderr)
    began = time.monotonic()
    label = "alone" if alone else "beside"
    outs = [root / label / f"r{repeat}" / run.name.replace(" ", "_").replace("=", "") for run in runs]
    procs = [start(out, run, repeat) for out, run in zip(outs, runs)]
    ended: dict[int, tuple[int, Any, float]] = {}
    while len(ended) < len(procs):  # each as it ends: its own wall time and CPU
        pid, status, usage = os.wait4(-1, 0)
        ended[pid] = (status, usage, time.monotonic())
    return [finish(proc, ended[proc.pid], out, run, began, alone) for proc, out, run in zip(procs, outs, runs)]


def certify(runs: list[Run]) -> dict[str, Any]:
    """The link check of each run's D beside the rest of the budget (that D its only candidate)."""
    found = {}
    for run in runs:
        cfg = load(list(run.overrides))
        hosts, pattern = links_of(cfg)
        try:
            choice = accurate_factor(
                hosts, cfg.network.rate, cfg.network.burst, candidates=[run.factor], backend=pattern, budget=LINK_BUDGET
            )
            found[run.name] = {"certified": True, "worst": [m.worst for m in choice.measurements]}
        except Exception as exc:  # noqa: BLE001 (a refused D is a finding, printed)
            found[run.name] = {"certified": False, "error": str(exc)}
        print(f"check {run.name}: {found[run.name]}", file=sys.stderr)
    return found


def cell(values: list[float]) -> str:
    """Mean +- 95% half-width."""
    if not values:
        return "failed"
    e = mean_interval(values)
    return f"{e.mean:8.1f} ± {e.half_width:6.1f}" if len(values) > 1 else f"{e.mean:8.1f}"


def report(runs: list[Run], records: list[dict[str, Any]], checks: dict[str, Any], walls: dict[str, float]) -> None:
    """Print the table and the wall time saved."""
    print(f"Target-equivalent images/sec (ResNet-50/1K, V100 modelled), side-by-side budget {LINK_BUDGET}")
    print(
        "| run | certified | alone | beside | difference | overruns/stalls alone, beside | cores alone "
        "(per rank) | cores declared |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        mine = [r for r in records if r["name"] == run.name]
        alone = [r for r in mine if r["alone"] and r["ok"]]
        beside = [r for r in mine if not r["alone"] and r["ok"]]
        a = [r["target_images_per_sec"] for r in alone]
        b = [r["target_images_per_sec"] for r in beside]
        diff = "n/a"
        if len(a) > 1 and len(b) > 1:
            ratio = ratio_interval(mean_interval(b), mean_interval(a))
            diff = f"{(ratio.mean - 1) * 100:+.1f} ± {ratio.half_width * 100:.1f}%"
        counts = " , ".join(
            f"{sum(r['overruns'] for r in group)}/{sum(r['stalls'] for r in group)}" for group in (alone, beside)
        )
        cores = statistics.fmean(r["cores"] for r in alone) if alone else float("nan")
        auto = [o for o in run.overrides if not o.startswith("dilation.factor=")] + ["dilation.factor=auto"]
        cfg = load(auto)  # as the workflow runs it: D from a link check certified beside the budget
        ranks = of_strategy(cfg.strategy, cfg.cluster.gpus).world_size
        demand = train_demand(cfg, {"factor": run.factor, "budget": LINK_BUDGET})
        check = checks.get(run.name, {}).get("certified", "not run")
        declared = "alone" if demand.cores is None else f"{demand.cores:.2f} ({demand.link_mbps} Mbit/s)"
        print(
            f"| {run.name} | {check} | {cell(a)} | {cell(b)} | {diff} | {counts} | {cores:.2f} "
            f"({cores / ranks:.3f}) | {declared} |"
        )
    saved = walls["alone"] - walls["beside"]
    print(
        f"wall time: alone {walls['alone']:.0f} s, side by side {walls['beside']:.0f} s "
        f"(saved {saved:.0f} s, {saved / walls['alone'] * 100:.0f}%)"
    )


def main() -> int:
    """Certify, run alone and in pairs round by round, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run (after 1 warm-up)")
    parser.add_argument("--no-check", action="store_true", help="skip certifying each D beside the budget")
    parser.add_argument("--records", type=Path, help="print the table of an earlier run's runs.json, running nothing")
    args = parser.parse_args()
    runs = configurations(args.steps)
    if args.records:
        saved = json.loads(args.records.read_text())
        report(runs, saved["records"], saved["checks"], saved["walls"])
        return 0
    root = args.out or Path(tempfile.mkdtemp(prefix="side_by_side-"))
    checks = {} if args.no_check else certify(runs)
    pairs = [runs[:2], runs[2:]]
    records: list[dict[str, Any]] = []
    walls = {"alone": 0.0, "beside": 0.0}
    for repeat in range(args.repeats):
        for run in runs:
            began = time.monotonic()
            records += together(root, [run], repeat, alone=True)
            walls["alone"] += time.monotonic() - began
        for pair in pairs:
            began = time.monotonic()
            records += together(root, pair, repeat, alone=False)
            walls["beside"] += time.monotonic() - began
    (root / "runs.json").write_text(json.dumps({"records": records, "checks": checks, "walls": walls}, indent=1))
    for record in records:
        if not record["ok"]:
            print(f"failed: {record['name']} ({'alone' if record['alone'] else 'beside'}): {record['error']}")
    report(runs, records, checks, walls)
    print(f"records: {root / 'runs.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
