"""The launcher places ranks on emulated hosts: its own cluster, or a shared one handed down by env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ralp_pipe.runtime.emulated import SHARED_HOSTS_ENV, EmulatedCluster, emulated_sites
from ralp_pipe.runtime.launch import launch_local

pytestmark = pytest.mark.netns

RANK = textwrap.dedent(
    """
    import datetime, os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    total = torch.ones(1)
    dist.all_reduce(total)
    netns = os.readlink("/proc/self/ns/net")
    with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as out:
        out.write(f"{os.environ['RALP_PIPE_HOST']} {os.environ['MASTER_ADDR']} {int(total)} {netns}")
    dist.destroy_process_group()
    """
)


def _ranks(folder: Path, world_size: int) -> list[list[str]]:
    return [(folder / str(rank)).read_text().split() for rank in range(world_size)]


@pytest.mark.slow  # builds a cluster and runs ranks (~9 s)
def test_a_run_gets_a_host_per_rank_on_its_own_cluster(tmp_path: Path) -> None:
    with emulated_sites([0, 1, 2], "1gbit", "1mb") as sites:
        launch_local([sys.executable, "-c", RANK, str(tmp_path)], 3, 120, tmp_path, sites=sites)
    ranks = _ranks(tmp_path, 3)
    assert [r[:3] for r in ranks] == [["0", "10.213.0.1", "3"], ["1", "10.213.0.1", "3"], ["2", "10.213.0.1", "3"]]
    assert len({r[3] for r in ranks}) == 3 and os.readlink("/proc/self/ns/net") not in {r[3] for r in ranks}


@pytest.mark.slow  # builds a cluster and runs ranks (~7 s)
def test_a_child_launcher_joins_the_shared_cluster_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with EmulatedCluster(3, "1gbit") as cluster:
        monkeypatch.setenv(SHARED_HOSTS_ENV, cluster.share([2, 0], master_host=2)[SHARED_HOSTS_ENV])
        with emulated_sites([0, 1], "unlimited", "1mb") as sites:
            launch_local([sys.executable, "-c", RANK, str(tmp_path)], 2, 120, tmp_path, sites=sites)
        host_namespaces = [cluster.run(h, ["readlink", "/proc/self/ns/net"]).stdout.strip() for h in (2, 0)]
    ranks = _ranks(tmp_path, 2)
    assert [r[:3] for r in ranks] == [["2", "10.213.0.3", "2"], ["0", "10.213.0.3", "2"]]
    assert [r[3] for r in ranks] == host_namespaces


def test_a_shared_layout_for_another_world_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with EmulatedCluster(2) as cluster:
        monkeypatch.setenv(SHARED_HOSTS_ENV, cluster.share([0, 1], master_host=0)[SHARED_HOSTS_ENV])
        with pytest.raises(ValueError, match="places 2 ranks but this run has 3"):
            with emulated_sites([0, 1, 2], "1gbit", "1mb"):
                pass


@pytest.mark.slow  # a training run on an emulated cluster (~37 s)
def test_an_emulated_training_run_reports_wire_bytes_that_agree_with_the_counted_bytes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = [
        "cluster=emulated",
        "network=1gbit",
        "model=resnet18",
        "strategy=ps",
        "cluster.gpus=2",
        "dataset.num_classes=10",
        "train.batch_size=2",
        "train.image_size=32",
        "train.warmup_steps=1",
        "train.measure_steps=2",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *overrides],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    counted, wire = metrics["gb_per_step"]["total"], metrics["wire_gb_per_step"]
    assert counted <= wire <= 1.05 * counted, (counted, wire)  # TCP/IP headers ride on top of the payload
    assert sorted(metrics["wire_per_host"]) == ["h0", "h1", "h2"]
    assert metrics["rate"] == "1gbit"
