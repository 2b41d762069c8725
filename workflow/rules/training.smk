# One distributed training measurement per dataset x model x strategy row x N x network x repeat
# (arm: the strategy, or <strategy>-sequential for experiment.sequential; r<repeat>: experiment.repeats).


rule train:
    input:
        shards=MATRIX.path("shards"),
        plan=MATRIX.path("plan"),
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
    threads: workflow.cores  # throughput measurements run alone
    resources:
        mem_mb=slurm_resource("train", "mem_mb"),
        runtime=slurm_resource("train", "runtime"),
        slurm_partition=slurm_resource("train", "slurm_partition", ""),
        nodes=slurm_resource("train", "nodes"),
        tasks=slurm_resource("train", "tasks"),
        cpus_per_task=slurm_resource("train", "cpus_per_task"),
        mpi=slurm_resource("train", "mpi"),
        tasks_per_gpu=slurm_resource("train", "tasks_per_gpu"),
        gres=slurm_resource("train", "gres", ""),
        slurm_extra=slurm_resource("train", "slurm_extra", ""),
    params:
        key=stage_params("train"),
        args=stage_args("train"),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
    shell:
        "ralp-pipe train --out {params.out:q} --shards {input.shards:q} --plan {input.plan:q} {params.args}"
        " > {log:q} 2>&1"


# Several training jobs at once on one emulated network (experiment.concurrent), each also alone.
rule concurrent:
    output:
        f"{MATRIX.path('concurrent')}/{CONCURRENT_FILE}",
    log:
        MATRIX.log("concurrent"),
    wildcard_constraints:
        index=r"\d+",
    conda:
        ENV
    threads: workflow.cores  # throughput measurements run alone
    resources:
        mem_mb=concurrent_resource("mem_mb"),
        runtime=concurrent_resource("runtime"),
        slurm_partition=concurrent_resource("slurm_partition", ""),
        nodes=concurrent_resource("nodes"),
        tasks=concurrent_resource("tasks"),
        cpus_per_task=concurrent_resource("cpus_per_task"),
        slurm_extra=concurrent_resource("slurm_extra", ""),
    params:
        key=lambda wildcards: MATRIX.concurrent_params(int(wildcards.index)),
        args=lambda wildcards: shlex.join(MATRIX.concurrent_args(int(wildcards.index))),
        out=lambda wildcards, output: os.path.dirname(output[0]),
    shell:
        "ralp-pipe concurrent --out {params.out:q} {params.args} > {log:q} 2>&1"
