# Helpers shared by the rules: look a run up from wildcards, stage params, SLURM resources.
import os

from ralp_pipe.contract.layout import CONCURRENT_FILE, METRICS_FILE, STEPS_FILE
from ralp_pipe.workflow import resources as side_by_side

# Training runs go side by side where this machine keeps up (ralp_pipe.workflow.resources): their cores, and the
# load of the emulated links of the runs going at once, at most the budget their link checks certified D beside.
if not MATRIX.settings.slurm:
    workflow.global_resources.setdefault(
        side_by_side.LINK_RESOURCE, side_by_side.budget_mbps()
    )
    workflow.global_resources.setdefault(
        side_by_side.CPU_RESOURCE, 1000 * workflow.cores
    )


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
        resources = lambda wildcards: MATRIX.concurrent_resources()
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


def train_demand(wildcards, input):
    """What a training job needs of this machine (ralp_pipe.workflow.resources), its D from its link check."""
    return side_by_side.demand_of(MATRIX.config(run_of(wildcards)), input.link_check)


def train_threads(wildcards):
    """A training job's threads: every core under SLURM (its nodes are its own) or where it goes alone, else one."""
    if MATRIX.settings.slurm:
        return workflow.cores
    return side_by_side.threads(MATRIX.config(run_of(wildcards)), workflow.cores)


def train_side_by_side_resources():
    """A training job's cores and link load, for the local scheduler only (none under SLURM)."""
    if MATRIX.settings.slurm:
        return {}
    return {
        side_by_side.CPU_RESOURCE: lambda wildcards, input: side_by_side.cpu_units(
            train_demand(wildcards, input), workflow.cores
        ),
        side_by_side.LINK_RESOURCE: lambda wildcards, input: side_by_side.link_units(
            train_demand(wildcards, input)
        ),
    }
