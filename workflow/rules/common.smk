# Helpers shared by the rules: look a run up from wildcards, stage params, SLURM resources.
import os

from ralp_pipe.results.layout import CONCURRENT_FILE, METRICS_FILE, STEPS_FILE


def run_of(wildcards, stage="train"):
    """The (first) matrix run a job of `stage` with these wildcards stands for."""
    return MATRIX.job_run(stage, dict(wildcards.items()))


def stage_params(stage):
    """Rerun key of `stage`: the resolved config values it reads plus its arguments (JSON)."""
    return lambda wildcards: MATRIX.stage_params(stage, run_of(wildcards, stage))


def stage_args(stage):
    """The stage's Hydra overrides for a job, shell-quoted."""
    return lambda wildcards: MATRIX.stage_command(stage, run_of(wildcards, stage))


def slurm_resource(stage, name, default=None):
    """One SLURM resource of a job of `stage` (ralp_pipe.workflow.slurm), or `default` where it asks none."""
    return lambda wildcards: MATRIX.slurm_resources(
        run_of(wildcards, stage), stage
    ).get(name, default)


def concurrent_resource(name, default=None):
    """One SLURM resource of a concurrent-workload job, or `default` where it asks none."""
    return lambda wildcards: MATRIX.concurrent_resources(int(wildcards.index)).get(
        name, default
    )
