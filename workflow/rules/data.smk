# Shards of each dataset: webdataset tars, DALI index files, classes.json and manifest.json.


rule prepare_shards:
    output:
        directory(MATRIX.path("shards")),
    log:
        MATRIX.log("prepare_shards"),
    conda:
        ENV
    threads:
        lambda wildcards: MATRIX.stage_config(
            "prepare_shards", run_of(wildcards)
        ).dataset.shards.workers
    resources:
        **slurm_resources("prepare_shards", "mem_mb", "runtime"),
    params:
        key=stage_params("prepare_shards"),
        args=stage_args("prepare_shards"),
    shell:
        "ralp-pipe prepare-shards --no-progress {params.args} > {log:q} 2>&1"
