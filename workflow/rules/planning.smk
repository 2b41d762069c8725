# Per model x dataset x N x network: profile the model on this hardware, then plan the split.


rule profile:
    input:
        MATRIX.path("shards"),
    output:
        MATRIX.path("profile"),
    log:
        f"{MATRIX.path('logs')}/profile/{{dataset}}/{{model}}/n{{gpus}}-{{network}}.log",
    conda:
        ENV
    threads: workflow.cores  # timing measurements run alone
    resources:
        mem_mb=slurm_resource("profile", "mem_mb"),
        runtime=slurm_resource("profile", "runtime"),
        slurm_partition=slurm_resource("profile", "slurm_partition", ""),
    params:
        key=stage_params("profile"),
        args=stage_args("profile"),
    shell:
        "ralp-pipe profile --out {output:q} {params.args} > {log:q} 2>&1"


rule plan:
    input:
        MATRIX.path("profile"),
    output:
        MATRIX.path("plan"),
    log:
        f"{MATRIX.path('logs')}/plan/{{dataset}}/{{model}}/n{{gpus}}-{{network}}.log",
    conda:
        ENV
    resources:
        mem_mb=slurm_resource("plan", "mem_mb"),
        runtime=slurm_resource("plan", "runtime"),
        slurm_partition=slurm_resource("plan", "slurm_partition", ""),
    params:
        key=stage_params("plan"),
        args=stage_args("plan"),
    shell:
        "ralp-pipe plan --profile {input:q} --out {output:q} {params.args} > {log:q} 2>&1"
