# Profile compute once per model x classes x batch x image size x device kind x N (N=1 plans from the
# largest N's), probe each network's link once, then plan the split per dataset x model x N x network.
# Where a dilated run's factor is auto (modelled mode), check its emulated links once per number of hosts x
# pattern (star: workers and a PS or PS device; ring: all-reduce) x network, shared by every run that has them.
from ralp_pipe.contract.topology import LINK_PATTERNS


rule profile:
    output:
        MATRIX.path("profile"),
    log:
        MATRIX.log("profile"),
    wildcard_constraints:
        classes=r"\d+",
        batch=r"\d+",
        size=r"\d+",
        hw=r"[a-z]+-[A-Za-z0-9_.-]+",
    conda:
        ENV
    threads: workflow.cores  # timing measurements run alone here; under SLURM cpus_per_task bounds them
    resources:
        **slurm_resources(
            "profile", "mem_mb", "runtime", "cpus_per_task", "gres", "slurm_extra"
        ),
    params:
        key=stage_params("profile"),
        args=stage_args("profile"),
    shell:
        "ralp-pipe profile --no-bandwidth --out {output:q} {params.args} > {log:q} 2>&1"


rule probe:
    output:
        MATRIX.path("link"),
    log:
        MATRIX.log("probe"),
    conda:
        ENV
    threads: workflow.cores  # bandwidth measurements run alone
    resources:
        **slurm_resources(
            "probe",
            "mem_mb",
            "runtime",
            "cpus_per_task",
            "nodes",
            "tasks",
            "mpi",
            "slurm_extra",
        ),
    params:
        key=stage_params("probe"),
        args=stage_args("probe"),
    shell:
        "ralp-pipe profile --link-only --out {output:q} {params.args} > {log:q} 2>&1"


rule plan:
    input:
        profile=lambda wildcards: MATRIX.path("profile", run_of(wildcards, "plan")),
        link=MATRIX.path("link"),
    output:
        MATRIX.path("plan"),
    log:
        MATRIX.log("plan"),
    conda:
        ENV
    resources:
        **slurm_resources("plan", "mem_mb", "runtime"),
    params:
        key=stage_params("plan"),
        args=stage_args("plan"),
    shell:
        "ralp-pipe plan --profile {input.profile:q} --link {input.link:q} --out {output:q} {params.args}"
        " > {log:q} 2>&1"


rule check_links:
    output:
        MATRIX.path("link_check"),
    log:
        MATRIX.log("check_links"),
    wildcard_constraints:
        hosts=r"\d+",
        pattern="|".join(LINK_PATTERNS),
    conda:
        ENV
    threads: workflow.cores  # link measurements run alone
    resources:
        **slurm_resources(
            "check_links",
            "mem_mb",
            "runtime",
            "nodes",
            "tasks",
            "cpus_per_task",
            "slurm_extra",
        ),
    params:
        key=stage_params("check_links"),
        args=stage_args("check_links"),
        # locally, D certified beside the rest of the side-by-side budget (ralp_pipe.workflow.resources)
        budget="" if MATRIX.settings.slurm else f"--budget {side_by_side.LINK_BUDGET}",
    shell:
        "ralp-pipe check-links --out {output:q} --hosts {wildcards.hosts} --pattern {wildcards.pattern}"
        " {params.budget} {params.args} > {log:q} 2>&1"


# experiment.measured_profiles: this machine's compute measured beside the target's modelled profile, and the plan
# made from it on the same network (summary.md sets the two splits side by side; no run trains with it).
rule profile_measured:
    output:
        MATRIX.path("measured_profile"),
    log:
        MATRIX.log("profile_measured"),
    wildcard_constraints:
        classes=r"\d+",
        batch=r"\d+",
        size=r"\d+",
        hw=r"[a-z]+-[A-Za-z0-9_.-]+",
    conda:
        ENV
    threads: workflow.cores  # timing measurements run alone
    params:
        key=lambda wildcards: MATRIX.measured_params(
            "profile", MATRIX.measured_run("profile", wildcards)
        ),
        args=lambda wildcards: shlex.join(
            MATRIX.measured_args("profile", MATRIX.measured_run("profile", wildcards))
        ),
    shell:
        "ralp-pipe profile --no-bandwidth --out {output:q} {params.args} > {log:q} 2>&1"


rule plan_measured:
    input:
        profile=lambda wildcards: MATRIX.path(
            "measured_profile", MATRIX.measured_run("plan", wildcards)
        ),
        link=MATRIX.path("link"),
    output:
        MATRIX.path("measured_plan"),
    log:
        MATRIX.log("plan_measured"),
    conda:
        ENV
    params:
        key=lambda wildcards: MATRIX.measured_params(
            "plan", MATRIX.measured_run("plan", wildcards)
        ),
        args=lambda wildcards: shlex.join(
            MATRIX.measured_args("plan", MATRIX.measured_run("plan", wildcards))
        ),
    shell:
        "ralp-pipe plan --profile {input.profile:q} --link {input.link:q} --out {output:q} {params.args}"
        " > {log:q} 2>&1"
