"""Reruns of the real workflow: a failed training run resumes alone; only stages whose inputs changed rerun.

One module-scoped run of a trimmed `smoke` experiment (two 40-class datasets, allreduce only: two
training runs) does the work; one training run is killed mid-run (a rank gets SIGKILL) to prove
the resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe.contract.layout import PLOT_NAMES
from ralp_pipe.results.verify import verify_bundle
from support.procs import children, cmdline, descendants
from workflow_helpers import SNAKEMAKE, config_args, pending, snakemake

CONFIG = {
    "experiment": "smoke",
    "overrides": ["experiment.datasets=[synthetic1k,synthetic22k]", "experiment.strategies=[allreduce]"],
    "dataset_overrides": {"synthetic1k": ["dataset.num_classes=40"], "synthetic22k": ["dataset.num_classes=40"]},
    "stage_options": {"profile": "--repeats 1 --warmup 0 --message-mb 1 --bandwidth-repeats 1"},
}
VICTIM = "runs/synthetic22k/resnet18/n2-loopback/allreduce/r0"
RUN = "dataset={}, model=resnet18, gpus=2, network=loopback"
TAIL = {("aggregate", ""), ("bundle", ""), ("all", "")}
# pytest-timeout counts the module fixture's setup against the first test that requests it, and
# `-k` may make any test that one. Its internal deadlines: kill_one_rank 400 s + the first snakemake's
# communicate 400 s + one dry run 120 s + the second snakemake 400 s = 1320 s, then a test's own
# work, at most the report's 200 s: 1520 s. The pyproject's 600 s would kill the fixture before its
# own deadlines could report what hung; 1600 s leaves them the word.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1600)]


def kill_one_rank(snake: subprocess.Popen[str], run_dir: str, timeout_s: float = 400) -> None:
    """SIGKILL a rank of the training run writing `run_dir`, once its launcher has started them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and snake.poll() is None:
        for pid in descendants(snake.pid):
            line = cmdline(pid)
            if "ralp-pipe train" in line and run_dir in line and not line.startswith("/bin/sh"):
                ranks = children(pid)
                if ranks:
                    os.kill(ranks[-1], signal.SIGKILL)
                    return
        time.sleep(0.05)
    raise AssertionError(f"the training run {run_dir} never started its ranks")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smoke workflow that lost one training run, then completed by a second invocation."""
    work = tmp_path_factory.mktemp("workflow")
    command = [*SNAKEMAKE, "--directory", str(work), "--cores", "2", "--keep-going", *config_args(CONFIG)]
    with subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as snake:
        try:
            kill_one_rank(snake, VICTIM)
            first, _ = snake.communicate(timeout=400)
        finally:
            if snake.poll() is None:
                snake.kill()
    results = work / "results"
    assert snake.returncode != 0, first
    finished = sorted(p.parent.relative_to(results).as_posix() for p in results.glob("runs/**/metrics.json"))
    assert finished == ["runs/synthetic1k/resnet18/n2-loopback/allreduce/r0"], first
    assert not (results / VICTIM / "metrics.json").exists() and not (results / "tables").exists()
    assert pending(work, CONFIG) == TAIL | {("train", RUN.format("synthetic22k") + ", arm=allreduce, repeat=0")}
    second = snakemake(work, "--cores", "2", config=CONFIG, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (results / VICTIM / "metrics.json").exists()
    return work


def test_resumed_workflow_produces_tables_and_a_verifying_bundle(workdir: Path) -> None:
    results = workdir / "results"
    runs = pd.read_parquet(results / "tables" / "runs.parquet")
    assert sorted(runs["run"]) == [f"{d}/resnet18/n2-loopback/allreduce" for d in ("synthetic1k", "synthetic22k")]
    assert set(runs["classes"]) == {40}
    assert (runs.images_per_sec > 0).all()
    bundles = list((results / "bundles").glob("smoke-*.tar.gz"))
    assert len(bundles) == 1 and verify_bundle(bundles[0]).runs == 2
    resolved = json.loads((results / "configs" / "smoke.json").read_text())
    assert resolved["settings"]["dataset_overrides"] == CONFIG["dataset_overrides"]


def test_nothing_reruns_without_a_change(workdir: Path) -> None:
    assert pending(workdir, CONFIG) == set()


def test_a_training_option_reruns_only_training_aggregation_and_bundle(workdir: Path) -> None:
    changed = {**CONFIG, "overrides": [*CONFIG["overrides"], "train.measure_steps=3"]}
    trains = {("train", RUN.format(d) + ", arm=allreduce, repeat=0") for d in ("synthetic1k", "synthetic22k")}
    assert pending(workdir, changed) == TAIL | trains | {("resolved_config", "")}


def test_a_dataset_option_reruns_that_dataset_downstream_and_nothing_else(workdir: Path) -> None:
    changed = {
        **CONFIG,
        "dataset_overrides": {
            **CONFIG["dataset_overrides"],
            "synthetic22k": ["dataset.num_classes=40", "dataset.synthetic.seed=7"],
        },
    }
    # the compute profile reads no image (only the class count) and the link probe none: both stay,
    # and so does the plan made from them
    expected = TAIL | {
        ("resolved_config", ""),
        ("prepare_shards", "dataset=synthetic22k"),
        ("train", RUN.format("synthetic22k") + ", arm=allreduce, repeat=0"),
    }
    assert pending(workdir, changed) == expected


def test_another_n_adds_its_own_profile_plan_and_runs_and_reruns_nothing_of_n_2(workdir: Path) -> None:
    changed = {**CONFIG, "overrides": [*CONFIG["overrides"], "experiment.gpus=[2,3]"]}
    added = {
        ("profile", "model=resnet18, classes=40, batch=2, size=32, hw=local-auto, gpus=3"),
        *(("plan", f"dataset={d}, model=resnet18, gpus=3, network=loopback") for d in ("synthetic1k", "synthetic22k")),
        *(
            ("train", RUN.format(d).replace("gpus=2", "gpus=3") + ", arm=allreduce, repeat=0")
            for d in ("synthetic1k", "synthetic22k")
        ),
    }
    assert pending(workdir, changed) == TAIL | {("resolved_config", "")} | added


def test_report_shows_the_tables_and_plots(workdir: Path) -> None:
    report = workdir / "report.html"
    result = snakemake(workdir, "--report", str(report), config=CONFIG, timeout=200)
    assert result.returncode == 0, result.stdout + result.stderr
    html = report.read_text(errors="replace")
    for name in (
        *(f"{name}.png" for name in PLOT_NAMES),
        "runs.parquet",
        "breakdown.parquet",
        "summary.md",
    ):
        assert name in html
