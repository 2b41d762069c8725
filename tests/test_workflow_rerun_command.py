"""`ralp-pipe rerun`: a deleted run folder comes back, with the tables and the bundle made from it again.

Snakemake alone keeps outputs whose intermediate inputs vanished ("Nothing to be done"); the command
forces the run's training job and so everything downstream. One module-scoped workflow of a trimmed
`smoke` experiment (one 40-class dataset, allreduce only: one training run) does the work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from conftest import RALP_PIPE, Ran
from ralp_pipe.results.verify import verify_bundle
from workflow_helpers import pending, snakemake

CONFIG = {
    "experiment": "smoke",
    "overrides": ["experiment.strategies=[allreduce]", "dataset.num_classes=40"],
    "stage_options": {"profile": "--repeats 1 --warmup 0 --message-mb 1 --bandwidth-repeats 1"},
}
RUN = "results/runs/synthetic1k/resnet18/n2-loopback/allreduce/r0"
ENTRIES = [f"{key}={json.dumps(value)}" for key, value in CONFIG.items()]  # as `--config` takes them


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trimmed smoke workflow, run to its bundle."""
    work = tmp_path_factory.mktemp("rerun")
    done = snakemake(work, "--cores", "2", config=CONFIG, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    return work


def _outputs(work: Path) -> dict[str, int]:
    """Modification times (ns) of the run's metrics, the runs table and the bundle."""
    bundles = sorted((work / "results" / "bundles").glob("smoke-*.tar.gz"))
    assert len(bundles) == 1, bundles
    paths = [work / RUN / "metrics.json", work / "results" / "tables" / "runs.parquet", bundles[0]]
    return {str(path): path.stat().st_mtime_ns for path in paths}


@pytest.mark.slow  # a snakemake workflow with one training run, then that run again
@pytest.mark.timeout(1200)
def test_a_deleted_run_comes_back_with_its_tables_and_bundle(workdir: Path) -> None:
    before = _outputs(workdir)
    shutil.rmtree(workdir / RUN)
    assert pending(workdir, CONFIG) == set()  # what the command is for: snakemake alone does nothing
    command = [str(RALP_PIPE), "rerun", RUN, *ENTRIES, "--cores", "2"]
    ran = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=500)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    after = _outputs(workdir)
    assert after.keys() == before.keys() and all(after[path] > before[path] for path in before), (before, after)
    assert verify_bundle(Path(list(after)[-1])).runs == 1
    assert pending(workdir, CONFIG) == set()


@pytest.mark.slow  # the dry run composes the experiment and asks snakemake (~10 s)
@pytest.mark.timeout(1200)
def test_a_dry_rerun_lists_the_run_and_all_downstream_of_it(workdir: Path) -> None:
    command = [str(RALP_PIPE), "rerun", "--dry-run", f"{workdir}/{RUN}", *ENTRIES, "--directory", str(workdir)]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for rule in ("train", "aggregate", "bundle"):
        assert f"rule {rule}:" in ran.stdout, ran.stdout
    assert "rule profile:" not in ran.stdout and "rule prepare_shards:" not in ran.stdout


def test_a_folder_that_is_no_run_of_the_experiment_is_refused_in_one_line(
    ralp_pipe: Callable[..., Ran], tmp_path: Path
) -> None:
    ran = ralp_pipe(
        "rerun", str(tmp_path / "results/runs/nowhere/r0"), "experiment=smoke", "--directory", str(tmp_path)
    )
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert "is not a run folder of experiment 'smoke'" in lines[0] and "synthetic1k/resnet18/n2-loopback" in lines[0]
