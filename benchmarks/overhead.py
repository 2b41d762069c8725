"""Where one emulated training run's wall time goes, per phase, for this checkout and (side by side) another revision.

Usage: python benchmarks/overhead.py [--baseline REV] [--repeats 3] [--out DIR] [overrides...]

Runs `ralp-pipe train` on the default experiment's configuration (``experiment=dilated``: ResNet-18 on 1000 classes,
N = 2 V100s modelled on a 10 Gbit/s emulated link at D = 8, 1 warm-up + 2 measured steps; extra Hydra overrides
are appended) and splits each run's wall time, from the moment this script starts the command to its exit, by the
phase marks the run records in metrics.json's ``timeline`` (the driver's and rank 0's, engine/train.py and
engine/rank.py):

- interpreter and imports: until the command's stage module is imported;
- configuration: composing and checking the config, the split, the analytic bytes, the host check, the staging;
- namespaces and links: the emulated hosts, their switch and shaped links;
- rank start: forking the ranks, entering their namespaces, joining the group, building model and strategy;
- warm-up: the warm-up steps (from rank 0's first barrier to the measured window's start);
- measured steps: the measured window;
- write-out: gathering the records, the ranks' exit, metrics.json and steps.parquet, the command's exit.

The overhead is the wall time minus warm-up and measured steps. The CPU column is the CPU time of every process
the run started (the command, its rank server, ranks and namespace holders: this script reaps them all as their
subreaper), which a busy machine changes less than wall time. `--baseline REV` measures REV the same way in a
`git worktree` under the temporary folder (with this checkout's virtual environment; its package shadowed by the
worktree's), alternating the two `--repeats` times so both see the same machine; each cell is the median. A
revision whose records lack ``timeline`` shows only its total, CPU and overhead (from the window it records).
Each run's target-equivalent images/sec shows that the measurement itself did not change. `--record` also writes the
table as a docs record (default ``docs/records/overhead.json``: the command, this checkout's revision, and per side
its revision, every run's phases and their medians).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "overhead.json"
RUN = [
    "experiment=dilated",
    "dataset=synthetic1k",
    "model=resnet18",
    "strategy=ps",
    "cluster.gpus=2",
    "network=10gbit",
]
# (phase, the mark it starts at, the mark it ends at); "launch" and "exit" are this script's own clock readings,
# "hosts_up" falls back to "configured" where no emulated hosts were made
PHASES = (
    ("interpreter and imports", "launch", "imported"),
    ("configuration", "imported", "configured"),
    ("namespaces and links", "configured", "hosts_up"),
    ("rank start", "hosts_up", "set_up"),
    ("warm-up", "set_up", "window_start"),
    ("measured steps", "window_start", "window_end"),
    ("write-out", "window_end", "exit"),
)
MEASURED = ("warm-up", "measured steps")
_PR_SET_CHILD_SUBREAPER = 36


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every descendant this process has reaped so far."""
    usage = os.times()
    return usage.children_user + usage.children_system


def reap_all() -> None:
    """Wait for every descendant left (a rank server outlives its command by a moment), so its CPU is counted."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run_once(tree: Path, out: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """One `ralp-pipe train` of `tree`'s package into `out`: its marks (seconds from launch), CPU and figures."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *RUN, *overrides]
    cpu_before = children_cpu_s()
    launch = time.time()
    subprocess.run(argv, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    end = time.time()
    reap_all()
    metrics = json.loads((out / "metrics.json").read_text())
    marks = {name: at - launch for name, at in (metrics.get("timeline") or {}).items()}
    marks.setdefault("hosts_up", marks.get("configured", float("nan")))
    return {
        "marks": {**marks, "launch": 0.0, "exit": end - launch},
        "cpu_s": children_cpu_s() - cpu_before,
        "window_s": metrics["window_s"],
        "target_images_per_sec": metrics["target_images_per_sec"],
    }


def phases(run: dict[str, Any]) -> dict[str, float]:
    """Seconds per phase of one run, then its total, overhead and CPU."""
    marks = run["marks"]
    seconds = {name: marks.get(end, float("nan")) - marks.get(begin, float("nan")) for name, begin, end in PHASES}
    total = marks["exit"]
    measured = sum(seconds[name] for name in MEASURED)
    if measured != measured:  # no timeline: the recorded window alone is known to be measurement
        measured = run["window_s"]
    return {**seconds, "total": total, "overhead": total - measured, "CPU (all processes)": run["cpu_s"]}


def median_row(runs: list[dict[str, Any]], key: str) -> float:
    """The median of one row over runs (NaN where a run lacks it)."""
    return statistics.median(phases(run)[key] for run in runs)


def table(sides: dict[str, list[dict[str, Any]]]) -> str:
    """The per-phase table: one column per side (median seconds over its runs)."""
    names = list(sides)
    rows = [name for name, _, _ in PHASES] + ["total", "overhead", "CPU (all processes)"]
    width = max(map(len, rows)) + 2
    lines = [f"{'phase (s)':<{width}}" + "".join(f"{name:>14}" for name in names)]
    for row in rows:
        lines.append(f"{row:<{width}}" + "".join(f"{median_row(sides[name], row):>14.3f}" for name in names))
    lines.append(
        f"{'target img/s':<{width}}"
        + "".join(f"{statistics.median(r['target_images_per_sec'] for r in sides[name]):>14.1f}" for name in names)
    )
    return "\n".join(lines)


def figures(sides: dict[str, list[dict[str, Any]]], revisions: dict[str, str]) -> dict[str, Any]:
    """The record's figures: per side its revision, the median of each row and every run's rows."""
    rows = [name for name, _, _ in PHASES] + ["total", "overhead", "CPU (all processes)"]
    return {
        "run": " ".join(RUN),
        "sides": {
            name: {
                "revision": revisions[name],
                "median_s": {row: round(median_row(runs, row), 3) for row in rows},
                "target_images_per_sec": round(statistics.median(r["target_images_per_sec"] for r in runs), 1),
                "runs": [{row: round(value, 3) for row, value in phases(run).items()} for run in runs],
            }
            for name, runs in sides.items()
        },
    }


def short_revision(tree: Path) -> str:
    """The short commit checked out in `tree` (``-dirty`` appended where its tracked files differ)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + (
        "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def worktree(rev: str, parent: Path) -> Path:
    """A detached `git worktree` of `rev` under `parent`."""
    path = parent / f"rev-{rev.replace('/', '_')}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="measure REV too, side by side (a git worktree of it)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating (default 3)")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a new temporary folder)")
    parser.add_argument(
        "--record",
        type=Path,
        nargs="?",
        const=RECORD,
        metavar="FILE",
        help=f"also write the table as a docs record (default {RECORD.relative_to(ROOT)})",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides appended to the run's")
    args = parser.parse_args()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    out = args.out or Path(tempfile.mkdtemp(prefix="overhead-"))
    trees = {"this checkout": ROOT}
    try:
        if args.baseline:
            trees = {args.baseline: worktree(args.baseline, out), **trees}
        sides: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for repeat in range(args.repeats):
            for index, (name, tree) in enumerate(trees.items()):
                run = run_once(tree, out / f"side{index}" / f"r{repeat}", args.overrides)
                sides[name].append(run)
                print(f"{name} r{repeat}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases(run).items()), flush=True)
        print(f"\n{' '.join(RUN + args.overrides)}; median of {args.repeats} runs a side\n")
        print(table(sides))
        if args.record:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from record import write_record

            revisions = {name: short_revision(tree) for name, tree in trees.items()}
            note = f"median of {args.repeats} runs a side, alternating; overrides: {' '.join(args.overrides) or 'none'}"
            write_record(args.record, figures(sides, revisions), note)
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


if __name__ == "__main__":
    main()
