"""The command table: the module that runs each ``ralp-pipe <stage>`` command, and what the command does.

The command line (:mod:`ralp_pipe.cli`) dispatches by it and lists it, in its order, when run without
arguments: the stages in the order data flows through them, then the tools (:data:`TOOLS`). The workflow
finds each stage's declared config keys (``CONFIG_KEYS``) in the module it names
(:mod:`ralp_pipe.workflow.matrix`). Naming modules, not importing them, keeps it free of every stage's imports.
"""

from __future__ import annotations

STAGES: dict[str, tuple[str, str]] = {
    "prepare-shards": ("ralp_pipe.data.shards", "turn an image collection into webdataset shards"),
    "profile": ("ralp_pipe.planning.profiling", "measure per-unit compute, memory and link bandwidth"),
    "plan": ("ralp_pipe.planning.planner", "choose the split point and predict throughput from a profile"),
    "check-links": (
        "ralp_pipe.runtime.linkcheck",
        "choose a dilated run's factor: the smallest D its emulated links deliver accurately",
    ),
    "train": ("ralp_pipe.engine.train", "run one distributed training measurement"),
    "concurrent": ("ralp_pipe.runtime.concurrent_jobs", "run several training jobs at once on one emulated network"),
    "aggregate": ("ralp_pipe.results.aggregate", "collect runs into Parquet tables, summaries and plots"),
    "bundle": ("ralp_pipe.results.bundle", "archive results with checksums"),
    "verify": ("ralp_pipe.results.verify", "check a bundle's checksums and recompute its tables"),
    "compare": ("ralp_pipe.results.compare", "compare two bundles' images/sec per configuration, beyond noise"),
    "simulate": ("ralp_pipe.planning.simulate", "predict throughput for clusters this machine is not"),
    "rerun": ("ralp_pipe.workflow.rerun", "run the workflow again for the given run folders and all that uses them"),
    "cluster": ("ralp_pipe.runtime.slurm_cluster", "start, stop or show a multi-node SLURM cluster on this machine"),
}
TOOLS = ("verify", "compare", "simulate", "rerun", "cluster")  # the last entries of STAGES: not steps of the workflow
