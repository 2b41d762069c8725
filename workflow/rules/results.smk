# Tables, plots and the reproducibility bundle of the whole experiment.
from ralp_pipe.contract.layout import (
    BREAKDOWN_TABLE,
    CONCURRENT_TABLE,
    MANIFEST_FILE,
    PLOT_NAMES,
    PLOTS_FOLDER,
    REPEATS_TABLE,
    RUNS_TABLE,
    SPEEDUPS_TABLE,
    SUMMARY_FILE,
)

RUNS = [MATRIX.path("run", run) for run in MATRIX]
PLANS = sorted({MATRIX.path("plan", run) for run in MATRIX})
PROFILES = sorted({MATRIX.path("profile", run) for run in MATRIX})
MEASURED_PROFILES = [
    MATRIX.path("measured_profile", run) for run in MATRIX.measured_runs
]
MEASURED_PLANS = [MATRIX.path("measured_plan", run) for run in MATRIX.measured_runs]
# each dataset's shard manifest (what was prepared, from which source), bundled beside the runs that read them
MANIFESTS = sorted({f"{MATRIX.path('shards', run)}/{MANIFEST_FILE}" for run in MATRIX})
LINKS = sorted({MATRIX.path("link", run) for run in MATRIX})
TABLES = MATRIX.path("tables")
CONCURRENT = [MATRIX.path("concurrent", index=i) for i in range(len(MATRIX.workloads))]


rule aggregate:
    input:
        metrics=[f"{run}/{METRICS_FILE}" for run in RUNS],
        steps=[f"{run}/{STEPS_FILE}" for run in RUNS],
        plans=PLANS,
        measured=MEASURED_PLANS,
        concurrent=[f"{folder}/{CONCURRENT_FILE}" for folder in CONCURRENT],
    output:
        runs=report(
            f"{TABLES}/{RUNS_TABLE}", caption="../report/runs.rst", category="Tables"
        ),
        repeats=report(
            f"{TABLES}/{REPEATS_TABLE}",
            caption="../report/repeats.rst",
            category="Tables",
        ),
        speedups=report(
            f"{TABLES}/{SPEEDUPS_TABLE}",
            caption="../report/speedups.rst",
            category="Tables",
        ),
        concurrent=report(
            f"{TABLES}/{CONCURRENT_TABLE}",
            caption="../report/concurrent.rst",
            category="Tables",
        ),
        breakdown=report(
            f"{TABLES}/{BREAKDOWN_TABLE}",
            caption="../report/breakdown.rst",
            category="Tables",
        ),
        summary=report(
            f"{TABLES}/{SUMMARY_FILE}",
            caption="../report/summary.rst",
            category="Tables",
        ),
        plots=[
            report(
                f"{TABLES}/{PLOTS_FOLDER}/{name}.png",
                caption=f"../report/plot_{name}.rst",
                category="Plots",
                labels={"plot": name},
            )
            for name in PLOT_NAMES
        ],
    log:
        f"{MATRIX.path('logs')}/aggregate.log",
    conda:
        ENV
    params:
        runs=RUNS,  # every run folder by name: one without metrics.json is refused, not left out
        out=lambda wildcards, output: os.path.dirname(output.runs),
    shell:
        "ralp-pipe aggregate --runs {params.runs:q} --plans {input.plans:q} --concurrent {input.concurrent:q}"
        " --measured-plans {input.measured:q} --out {params.out:q} > {log:q} 2>&1"


rule resolved_config:
    output:
        f"{RESULTS}/configs/{EXPERIMENT}.json",
    log:
        MATRIX.log("resolved_config"),
    params:
        digest=MATRIX.digest(),
    run:
        MATRIX.write_resolved(output[0])


rule bundle:
    input:
        config=rules.resolved_config.output,
        tables=rules.aggregate.output,
        profiles=PROFILES,
        links=LINKS,
        measured=MEASURED_PROFILES + MEASURED_PLANS,
        shards=sorted({MATRIX.path("shards", run) for run in MATRIX}),
    output:
        BUNDLE,
    log:
        MATRIX.log("bundle"),
    conda:
        ENV
    params:
        root=lambda wildcards, output: os.path.dirname(os.path.dirname(output[0])),  # results/bundles/x
        include=[
            *rules.resolved_config.output,
            *RUNS,
            *PLANS,
            *PROFILES,
            *LINKS,
            *MEASURED_PROFILES,
            *MEASURED_PLANS,
            *MANIFESTS,
            *CONCURRENT,
            TABLES,
        ],
    shell:
        "ralp-pipe bundle --root {params.root:q} --include {params.include:q} --out {output:q} > {log:q} 2>&1"
