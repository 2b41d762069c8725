"""`ralp-pipe concurrent` end to end: two tiny jobs, each alone, then together with their servers on one host, twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ralp_pipe.contract.layout import CONCURRENT_FILE, METRICS_FILE
from ralp_pipe.contract.records import RunMetrics
from ralp_pipe.results.aggregate import load_workloads
from ralp_pipe.results.tables import concurrent_table

pytestmark = [pytest.mark.slow, pytest.mark.netns]  # 2 rounds of 3 runs of two ranks each (42 s on 2 cores)

JOBS = ["strategy=ps cluster.gpus=1", "strategy=ralp_n cluster.gpus=2"]  # each a worker and a server rank
COMMON = [
    "network=loopback",
    "model=resnet18",
    "dataset.num_classes=10",
    "train.batch_size=2",
    "train.image_size=32",
    "train.warmup_steps=0",
    "train.measure_steps=1",
    "train.loader=synthetic",  # the stage is about sharing links, not input
    "experiment.repeats=2",  # two rounds, each job alone then both together
]


def test_the_concurrent_stage_runs_each_job_alone_and_together_and_summarises_them(tmp_path: Path) -> None:
    out = tmp_path / "w0"
    argv = [sys.executable, "-m", "ralp_pipe.cli", "concurrent", "--out", str(out)]
    # 550 s: under pytest-timeout's 600 s, so that a stage that hangs fails here, with its output
    proc = subprocess.run(
        [*argv, *(a for job in JOBS for a in ("--job", job)), *COMMON], capture_output=True, text=True, timeout=550
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / CONCURRENT_FILE).read_text())
    assert summary["network"] == {"rate": "unlimited", "burst": "1mb"} and summary["shared_host"] == 0
    # Server ranks (the PS, the RALP PS device) share host 0; every worker has a host of its own.
    assert [(job["job"], job["overrides"], job["hosts"]) for job in summary["jobs"]] == [
        (0, JOBS[0].split(), [1, 0]),
        (1, JOBS[1].split(), [2, 0]),
    ]
    assert summary["repeats"] == 2
    for job in summary["jobs"]:
        alone, together = (
            [RunMetrics.read(out / f"job{job['job']}" / f"r{r}" / run / METRICS_FILE) for r in range(2)]
            for run in ("alone", "together")
        )
        assert job["alone_runs"] == [m.images_per_sec for m in alone]
        assert job["together_runs"] == [m.images_per_sec for m in together]
        assert job["alone_images_per_sec"] == pytest.approx(sum(job["alone_runs"]) / 2, rel=1e-12)
        assert job["together_images_per_sec"] == pytest.approx(sum(job["together_runs"]) / 2, rel=1e-12)
        ratio = job["alone_images_per_sec"] / job["together_images_per_sec"]
        assert job["slowdown"] == pytest.approx(ratio, rel=1e-12)
        assert job["dilation_factor"] is None and alone[0].dilation is None  # undilated: the tables show these
        # Together, the jobs met at their round's gate: windows started at once, the link kept loaded to the last end.
        assert all(m.gate is None for m in alone)
        for m in together:
            assert m.gate is not None and m.gate["jobs"] == 2 and m.gate["tail_steps"] >= 0
        # Each run's ranks read their own host's link counters: the job ran on the hosts of its layout.
        for run in (*alone, *together):
            assert run.wire_per_host is not None and sorted(run.wire_per_host) == sorted(f"h{h}" for h in job["hosts"])
            assert run.model == "resnet18" and run.strategy == job["overrides"][0].split("=")[1]
        assert f"job {job['job']} ({' '.join(job['overrides'])}): alone" in proc.stdout
    for r in range(2):
        assert [len(list((out / f"r{r}-gate" / side).iterdir())) for side in ("in", "out")] == [2, 2]
    # What the stage wrote is what aggregation reads: one row per job, the same figures.
    table = concurrent_table(load_workloads([out / CONCURRENT_FILE]))
    assert len(table) == 2 and list(table["slowdown"]) == [job["slowdown"] for job in summary["jobs"]]
