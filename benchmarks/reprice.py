"""Recorded runs priced again: the cost model of this checkout against the prediction each run was planned with.

    python benchmarks/reprice.py WORKDIR [WORKDIR ...]

WORKDIR is where a workflow ran (it holds `results/`). For every training run under
`results/runs/` this rebuilds the run's plan from its own configuration, profile and link record
with the current cost model and takes the prediction at the run's own split (RALP) or strategy, so
a change of the cost model can be judged on measurements already made without training again.
It prints, per strategy and in all, the median absolute error of the recorded prediction and of
the current one against the measured target-equivalent images/sec, and the runs whose error
changed by more than 3 points. Reads only; writes nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from ralp_pipe.config.compose import from_dict
from ralp_pipe.contract.records import LinkProbe, Profile
from ralp_pipe.planning.planner import build_plan


def _at_split(entry: dict, split: int | None) -> float:
    """An entry's predicted images/sec at `split` (RALP: from its table of every split)."""
    if split is None:
        return float(entry["predicted_images_per_sec"])
    return float(next(row for row in entry["table"] if row["split"] == split)["predicted_images_per_sec"])


def reprice(workdir: Path) -> pd.DataFrame:
    """One row per training run under `workdir`: measured, recorded and current predicted images/sec."""
    by_plan: dict[str, list[dict]] = {}
    for metrics_path in sorted((workdir / "results" / "runs").glob("**/metrics.json")):
        metrics = json.loads(metrics_path.read_text())
        plan_path = metrics["config"]["strategy"]["plan"]
        if plan_path:  # a run without a plan (its split given by hand) has no recorded prediction
            by_plan.setdefault(plan_path, []).append({**metrics, "path": metrics_path})
    rows = []
    for plan_path, runs in by_plan.items():
        recorded = json.loads((workdir / plan_path).read_text())
        profile_path = workdir / recorded["profile"]
        link_path = workdir / recorded["link"] if recorded["link"] else None
        gpus = sorted({run["gpus"] for run in runs})
        # the strategies of one plan share what prices them (model, batch, link, PS placement, buckets)
        current = build_plan(
            Profile.read(profile_path),
            profile_path,
            from_dict(runs[0]["config"]),
            gpus,
            LinkProbe.read(link_path) if link_path else None,
            link_path,
        )
        for run in runs:
            strategy, split, n = run["strategy"], run["split"], str(run["gpus"])
            if strategy not in recorded["by_gpus"].get(n, {}):
                continue
            rows.append(
                {
                    "run": str(run["path"].parent.relative_to(workdir / "results" / "runs")),
                    "strategy": strategy,
                    "measured": run["target_images_per_sec"],
                    "recorded": _at_split(recorded["by_gpus"][n][strategy], split),
                    "current": _at_split(current.by_gpus[n][strategy], split),
                }
            )
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", type=Path, help="folders that hold a workflow's results/")
    args = parser.parse_args()
    frame = pd.concat([reprice(w).assign(workdir=str(w)) for w in args.workdirs], ignore_index=True)
    if frame.empty:
        print("no planned training runs found under " + ", ".join(f"{w}/results/runs" for w in args.workdirs))
        return 1
    for column in ("recorded", "current"):
        frame[f"{column}_err_%"] = (frame.measured / frame[column] - 1) * 100
    summary = frame.groupby("strategy")[["recorded_err_%", "current_err_%"]].agg(lambda e: e.abs().median())
    summary.loc["all"] = frame[["recorded_err_%", "current_err_%"]].abs().median()
    summary["runs"] = frame.groupby("strategy").size().reindex(summary.index).fillna(len(frame)).astype(int)
    beyond = {c: (frame[f"{c}_err_%"].abs() > 8).sum() for c in ("recorded", "current")}
    print(f"median |error| of the prediction against measured target img/s, {len(frame)} runs:\n")
    print(summary.round(2).to_string())
    print(f"\nruns beyond 8%: recorded {beyond['recorded']}, current {beyond['current']}")
    moved = frame[(frame["current_err_%"] - frame["recorded_err_%"]).abs() > 3]
    if not moved.empty:
        print("\nruns whose error moved by more than 3 points:\n")
        print(moved.drop(columns="workdir").round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
