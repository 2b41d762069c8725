# One distributed training measurement per dataset x model x strategy row x N x network x repeat
# (arm: the strategy, or <strategy>-sequential for experiment.sequential; r<repeat>: experiment.repeats).


rule train:
    input:
        shards=MATRIX.path("shards"),
        plan=MATRIX.path("plan"),
        link_check=lambda wildcards: MATRIX.link_check(run_of(wildcards)),
    output:
        metrics=f"{MATRIX.path('run')}/{METRICS_FILE}",
        steps=f"{MATRIX.path('run')}/{STEPS_FILE}",
    log:
        MATRIX.log("train"),
    wildcard_constraints:
        arm=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
        repeat=r"\d+",
    conda:
        ENV
    threads: train_threads  # alone, or beside others where the machine keeps up
    resources:
        **train_side_by_side_resources(),
        **slurm_resources(
            "train",
            "mem_mb",
            "runtime",
            "nodes",
            "tasks",
            "cpus_per_task",
            "mpi",
            "tasks_per_gpu",
            "gres",
            "slurm_extra",
        ),
    params:
        key=stage_params("train"),
        args=stage_args("train"),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        link_check=lambda wildcards: "".join(
            f" --link-check {shlex.quote(path)}"
            for path in MATRIX.link_check(run_of(wildcards))
        ),
    shell:
        "ralp-pipe train --out {params.out:q} --shards {input.shards:q} --plan {input.plan:q}"
        "{params.link_check} {params.args} > {log:q} 2>&1"


# Several training jobs at once on one emulated network (experiment.concurrent), each also alone: one job runs
# every workload (a job of several workloads runs alone once a round), workload i into concurrent/w<i>; a job that
# places layers trains with the plan of its configuration in the matrix.
if MATRIX.workloads:

    rule concurrent:
        input:
            plans=sorted(
                {
                    plan
                    for index in range(len(MATRIX.workloads))
                    for plan in MATRIX.workload_plans(index)
                    if plan
                }
            ),
        output:
            [
                f"{MATRIX.path('concurrent', index=index)}/{CONCURRENT_FILE}"
                for index in range(len(MATRIX.workloads))
            ],
        log:
            MATRIX.log("concurrent"),
        conda:
            ENV
        threads: workflow.cores  # throughput measurements run alone
        resources:
            **slurm_resources(
                "concurrent",
                "mem_mb",
                "runtime",
                "nodes",
                "tasks",
                "cpus_per_task",
                "slurm_extra",
            ),
        params:
            key=MATRIX.concurrent_params(),
            args=shlex.join(MATRIX.concurrent_args()),
            out=lambda wildcards, output: os.path.dirname(os.path.dirname(output[0])),
        shell:
            "ralp-pipe concurrent --out {params.out:q} {params.args} > {log:q} 2>&1"
