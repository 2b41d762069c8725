"""The results folder's layout, defined once: where each stage writes below ``paths.results``.

The workflow expands :data:`PATHS` (outputs) and :func:`log_path` (logs) for every run of the
matrix, and hands each stage the exact paths of its inputs; the train stage writes
:data:`METRICS_FILE` and :data:`STEPS_FILE` into a run folder; the plan stage writes
:data:`PLAN_FILE` below the plans folder; aggregate is named every run folder and plan file
and writes :data:`TABLE_FILES` and the plots folder into the tables folder.
"""

from __future__ import annotations

# What names one job's output (and its log) of each stage; the {wildcards} are a run's fields.
SHARDS_ID = "{dataset}"
# compute: one per model x classes x per-worker batch x image size x device kind (cluster kind-device) x N
PROFILE_ID = "{model}/{classes}c-{batch}b-{size}px-{hw}-n{gpus}"
LINK_ID = "{network}"  # the link probe of one network
# the dilation factor `ralp-pipe check-links` chose for runs of so many hosts whose links carry one pattern
# (star, ring) on one network
LINK_CHECK_ID = "{network}/{pattern}-h{hosts}"
PLAN_ID = "{dataset}/{model}/n{gpus}-{network}"
PLAN_FILE = PLAN_ID + ".json"  # below the plans folder
# A run below runs/: its configuration (the arm is the strategy, or <strategy>-sequential with
# strategy.overlap=false), then r<k> for the k-th of experiment.repeats independent repeats.
CONFIGURATION_ID = "{dataset}/{model}/n{gpus}-{network}/{arm}"
RUN_ID = CONFIGURATION_ID + "/r{repeat}"
CONCURRENT_ID = "w{index}"  # one workload of experiment.concurrent (one job runs them all: logs/concurrent.log)
SEQUENTIAL_SUFFIX = "-sequential"
MEASURED_FOLDER = "profiles/measured"  # experiment.measured_profiles: profiles measured here ...
MEASURED_PLANS_FOLDER = f"{MEASURED_FOLDER}/plans"  # ... and the plans made from them
# Outputs below the results folder
PATHS = {
    "shards": f"data/{SHARDS_ID}",
    "profile": f"profiles/compute/{PROFILE_ID}.json",
    "link": f"profiles/links/{LINK_ID}.json",
    "link_check": f"profiles/factors/{LINK_CHECK_ID}.json",
    "plan": f"plans/{PLAN_FILE}",
    # experiment.measured_profiles: this machine's compute, measured, and the plan made from it (beside the target's)
    "measured_profile": f"{MEASURED_FOLDER}/{PROFILE_ID}.json",
    "measured_plan": f"{MEASURED_PLANS_FOLDER}/{PLAN_FILE}",
    "run": f"runs/{RUN_ID}",
    "concurrent": f"concurrent/{CONCURRENT_ID}",
    "tables": "tables",
    "bundles": "bundles",
    "logs": "logs",
}
# stage -> what names its jobs' logs (logs/<stage>/<id>.log); a stage not listed has one log, logs/<stage>.log
LOG_IDS = {
    "prepare_shards": SHARDS_ID,
    "profile": PROFILE_ID,
    "probe": LINK_ID,
    "check_links": LINK_CHECK_ID,
    "plan": PLAN_ID,
    "profile_measured": PROFILE_ID,
    "plan_measured": PLAN_ID,
    "train": RUN_ID,
}
METRICS_FILE, STEPS_FILE = "metrics.json", "steps.parquet"  # in a run folder; metrics.json marks it complete
MANIFEST_FILE = "manifest.json"  # in a dataset's shards folder: what was prepared, from what
CONCURRENT_FILE = "concurrent.json"  # in a concurrent workload's folder
MAX_CONCURRENT_JOBS = 4  # jobs of one concurrent workload at most (k = 2 to 4 together; k = 1: each alone)
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
PLOT_NAMES = (
    "throughput_vs_n",
    "scaling_efficiency",
    "speedup",
    "gb_per_step",
    "predicted_vs_measured",
    "breakdown",
    "speedup_vs_link",
    "concurrent_slowdown",
)


def log_path(stage: str) -> str:
    """The log of a job of `stage` below the results folder (a pattern of the job's wildcards, as its output is)."""
    job = LOG_IDS.get(stage)
    return f"{PATHS['logs']}/{stage}.log" if job is None else f"{PATHS['logs']}/{stage}/{job}.log"


def arm(strategy: str, overlap: bool = True, variant: str | None = None) -> str:
    """The name of a strategy's row in the tables and its run folder: ``ps``, or ``ps-sequential`` without overlap;
    a run of an experiment.variants entry adds its name (``ralp_n-real``)."""
    name = strategy if overlap else strategy + SEQUENTIAL_SUFFIX
    return f"{name}-{variant}" if variant else name
