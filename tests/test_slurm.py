"""The `smoke` experiment through a real single-node SLURM started on localhost (slurmctld, slurmd, munge).

The cluster is started by the test and stopped by PID afterwards. Missing SLURM packages fail
the test with the command that installs them (CI installs them; see scripts/setup-system.sh).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from ralp_pipe.results.verify import verify_bundle
from support.localslurm import INSTALL_HINT, SYSTEM_CONF, LocalSlurm, _alive, _read_pid, missing_commands
from workflow_helpers import REPO, snakemake

pytestmark = pytest.mark.slurm

CONFIG = {
    "experiment": "smoke",
    "overrides": ["cluster.slurm.mem_mb=1000"],
    "stage_options": {"profile": "--repeats 1 --warmup 0 --message-mb 1 --bandwidth-repeats 1"},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """A running one-node SLURM; afterwards every daemon it started is gone and /etc/slurm is clean."""
    missing = missing_commands()
    if missing:
        pytest.fail(f"SLURM is not installed here (missing {', '.join(missing)}): {INSTALL_HINT}")
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    slurm.start()
    pids = {name: _read_pid(path) for name, path in slurm.pid_files.items()}
    try:
        yield slurm
    finally:
        slurm.stop()
    assert not any(pid and _alive(pid) for pid in pids.values()), pids
    assert not SYSTEM_CONF.is_symlink()


def test_smoke_experiment_runs_as_slurm_jobs(cluster: LocalSlurm, tmp_path: Path) -> None:
    profile = REPO / "profiles" / "slurm"
    result = snakemake(tmp_path, "--cores", "all", "--profile", str(profile), config=CONFIG, timeout=580)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    jobs = dict(re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: .*?/rule_(\w+)/", log))
    assert sorted(jobs.values()) == ["plan", "prepare_shards", "profile", "train", "train", "train", "train"], log
    tasks = []
    for job_id, rule in jobs.items():
        if rule == "train":
            shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
            tasks.append(int(re.search(r"NumTasks=(\d+)", shown).group(1)))
            assert "JobState=COMPLETED" in shown and "Partition=local" in shown, shown
    assert sorted(tasks) == [2, 2, 2, 3]  # ralp_h (1 worker + PS device), allreduce, ralp_n; ps (2 workers + PS)
    results = tmp_path / "results"
    for strategy in ("ps", "allreduce", "ralp_h", "ralp_n"):
        metrics = json.loads(
            (results / f"runs/synthetic1k/resnet18/n2-loopback/{strategy}/r0/metrics.json").read_text()
        )
        assert metrics["config"]["cluster"]["kind"] == "slurm" and metrics["images_per_sec"] > 0
    assert len(pd.read_parquet(results / "tables" / "runs.parquet")) == 4
    (bundle,) = (results / "bundles").glob("smoke-*.tar.gz")
    assert verify_bundle(bundle).runs == 4
