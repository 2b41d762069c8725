"""The results folder's layout, defined once: where each stage writes below ``paths.results``.

The workflow expands :data:`PATHS` for every run of the matrix; the train stage writes
:data:`METRICS_FILE` and :data:`STEPS_FILE` into a run folder; aggregate finds a run's plan
with :data:`PLAN_FILE` below the plans folder and writes :data:`TABLE_FILES` and the plots
folder into the tables folder.
"""

from __future__ import annotations

PLAN_FILE = "{dataset}/{model}/n{gpus}-{network}.json"  # below the plans folder
# Outputs below the results folder; the {wildcards} are a run's fields.
PATHS = {
    "shards": "data/{dataset}",
    "profile": "profiles/{dataset}/{model}/n{gpus}-{network}.json",
    "plan": f"plans/{PLAN_FILE}",
    "run": "runs/{dataset}/{model}/n{gpus}-{network}/{strategy}",
    "concurrent": "concurrent/w{index}",
    "tables": "tables",
    "bundles": "bundles",
    "logs": "logs",
}
METRICS_FILE, STEPS_FILE = "metrics.json", "steps.parquet"  # in a run folder; metrics.json marks it complete
CONCURRENT_FILE = "concurrent.json"  # in a concurrent workload's folder
RUNS_TABLE, SPEEDUPS_TABLE, CONCURRENT_TABLE = "runs.parquet", "speedups.parquet", "concurrent.parquet"
SUMMARY_FILE, PLOTS_FOLDER = "summary.md", "plots"
TABLE_FILES = (RUNS_TABLE, SPEEDUPS_TABLE, CONCURRENT_TABLE, SUMMARY_FILE)  # in the tables folder
PLOT_NAMES = ("throughput_vs_n", "gb_per_step", "speedup", "predicted_vs_measured")  # PNGs in the plots folder
