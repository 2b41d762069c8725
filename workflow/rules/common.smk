# Helpers shared by the rules: look a run up from wildcards, stage params, SLURM resources.
import os

from ralp_pipe.contract.layout import CONCURRENT_FILE, METRICS_FILE, STEPS_FILE


def run_of(wildcards, stage="train"):
    """The (first) matrix run a job of `stage` with these wildcards stands for."""
    return MATRIX.job_run(stage, dict(wildcards.items()))


def stage_params(stage):
    """Rerun key of `stage`: the resolved config values it reads plus its arguments (JSON)."""
    return lambda wildcards: MATRIX.stage_params(stage, run_of(wildcards, stage))


def stage_args(stage):
    """The stage's Hydra overrides for a job, shell-quoted."""
    return lambda wildcards: MATRIX.stage_command(stage, run_of(wildcards, stage))


# Where every job goes: cluster.slurm.partition and cluster.slurm.account.
PLACEMENT = ("slurm_partition", "slurm_account")


def slurm_resources(stage, *names):
    """SLURM resources `names` of every job of `stage` (ralp_pipe.workflow.slurm), each a function of the job's
    wildcards ("" where a job asks none), for the SLURM executor only: without it (launcher=local) no job asks
    SLURM for anything, so nothing about SLURM is computed or checked."""
    if not MATRIX.settings.slurm:
        return {}
    if stage == "concurrent":
        resources = lambda wildcards: MATRIX.concurrent_resources(int(wildcards.index))
    else:
        resources = lambda wildcards: MATRIX.slurm_resources(
            run_of(wildcards, stage), stage
        )
    return {
        name: (lambda wildcards, name=name: resources(wildcards).get(name, ""))
        for name in (*names, *PLACEMENT)
    }


def empty_logs(jobs):
    """Empty the existing log of every job in `jobs` (those this invocation will run), before any starts.

    A job that fails before its command starts (cancelled while queued on SLURM, its node lost)
    would otherwise show the previous run's log, ending in that run's success line, in the failure report.
    """
    for job in jobs:
        for log in job.log:
            try:
                os.truncate(log, 0)
            except FileNotFoundError:
                pass
