"""The results folder's layout, defined once: where each stage writes below ``paths.results``.

The workflow expands :data:`PATHS` for every run of the matrix; the train stage writes
:data:`METRICS_FILE` and :data:`STEPS_FILE` into a run folder; aggregate finds a run's plan
with :data:`PLAN_FILE` below the plans folder and writes :data:`TABLE_FILES` and the plots
folder into the tables folder.
"""

from __future__ import annotations

PLAN_FILE = "{dataset}/{model}/n{gpus}-{network}.json"  # below the plans folder
# A run below runs/: its configuration (the arm is the strategy, or <strategy>-sequential with
# strategy.overlap=false), then r<k> for the k-th of experiment.repeats independent repeats.
CONFIGURATION_ID = "{dataset}/{model}/n{gpus}-{network}/{arm}"
RUN_ID = CONFIGURATION_ID + "/r{repeat}"
SEQUENTIAL_SUFFIX = "-sequential"
# Outputs below the results folder; the {wildcards} are a run's fields.
PATHS = {
    "shards": "data/{dataset}",
    # compute: one per model x classes x per-worker batch x image size x device kind (cluster kind-device)
    "profile": "profiles/compute/{model}/{classes}c-{batch}b-{size}px-{hw}.json",
    "link": "profiles/links/{network}.json",  # the link probe of one network
    "plan": f"plans/{PLAN_FILE}",
    "run": f"runs/{RUN_ID}",
    "concurrent": "concurrent/w{index}",
    "tables": "tables",
    "bundles": "bundles",
    "logs": "logs",
}
METRICS_FILE, STEPS_FILE = "metrics.json", "steps.parquet"  # in a run folder; metrics.json marks it complete
CONCURRENT_FILE = "concurrent.json"  # in a concurrent workload's folder
RUNS_TABLE, SPEEDUPS_TABLE, CONCURRENT_TABLE = "runs.parquet", "speedups.parquet", "concurrent.parquet"
REPEATS_TABLE = "repeats.parquet"  # one row per repeat; runs.parquet has one row per configuration
BREAKDOWN_TABLE = "breakdown.parquet"  # one row per run: where a step's time goes
SUMMARY_FILE, PLOTS_FOLDER = "summary.md", "plots"
TABLE_FILES = (
    RUNS_TABLE,
    REPEATS_TABLE,
    SPEEDUPS_TABLE,
    CONCURRENT_TABLE,
    BREAKDOWN_TABLE,
    SUMMARY_FILE,
)  # in the tables folder
# PNGs in the plots folder, each captioned by workflow/report/plot_<name>.rst
PLOT_NAMES = ("throughput_vs_n", "scaling_efficiency", "speedup", "gb_per_step", "predicted_vs_measured", "breakdown")


def arm(strategy: str, overlap: bool = True) -> str:
    """The name of a strategy's row in the tables and its run folder: ``ps``, or ``ps-sequential`` without overlap."""
    return strategy if overlap else strategy + SEQUENTIAL_SUFFIX
