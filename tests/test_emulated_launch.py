"""The launcher places ranks on emulated hosts (its own cluster, or a shared one it is given); a real run is shaped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ralp_pipe.config import load
from ralp_pipe.config.units import TCP_PAYLOAD_PER_WIRE_BYTE, rate_bits_per_s
from ralp_pipe.contract.layout import STEPS_FILE
from ralp_pipe.engine.train import run
from ralp_pipe.runtime import emulated
from ralp_pipe.runtime.emulated import EmulatedCluster, emulated_sites
from ralp_pipe.runtime.launch import PythonMain, launch_local
from support.emulated_hosts import qdisc_stats

pytestmark = pytest.mark.netns

RANK = "support.netns_rank"  # a module whose main(argv) every rank runs


def _ranks(folder: Path, world_size: int) -> list[list[str]]:
    return [(folder / str(rank)).read_text().split() for rank in range(world_size)]


@pytest.mark.slow  # builds a cluster and runs ranks (~9 s)
def test_a_run_gets_a_host_per_rank_on_its_own_cluster(tmp_path: Path) -> None:
    with emulated_sites([0, 1, 2], "1gbit", "1mb") as sites:
        launch_local(PythonMain(RANK, (str(tmp_path),)), 3, 120, tmp_path, sites=sites)
    ranks = _ranks(tmp_path, 3)
    assert [r[:3] for r in ranks] == [["0", "10.213.0.1", "3"], ["1", "10.213.0.1", "3"], ["2", "10.213.0.1", "3"]]
    assert len({r[3] for r in ranks}) == 3 and os.readlink("/proc/self/ns/net") not in {r[3] for r in ranks}


@pytest.mark.slow  # builds a cluster and runs ranks (~7 s)
def test_a_child_launcher_joins_the_shared_cluster_it_is_given(tmp_path: Path) -> None:
    with EmulatedCluster(3, "1gbit") as cluster:
        shared = json.loads(json.dumps(cluster.share([2, 0], master_host=2)))  # as --shared-hosts hands it over
        with emulated_sites([0, 1], "unlimited", "1mb", shared) as sites:
            launch_local(PythonMain(RANK, (str(tmp_path),)), 2, 120, tmp_path, sites=sites)
        host_namespaces = [cluster.run(h, ["readlink", "/proc/self/ns/net"]).stdout.strip() for h in (2, 0)]
    ranks = _ranks(tmp_path, 2)
    assert [r[:3] for r in ranks] == [["2", "10.213.0.3", "2"], ["0", "10.213.0.3", "2"]]
    assert [r[3] for r in ranks] == host_namespaces


def test_a_shared_layout_for_another_world_size_is_refused() -> None:
    with EmulatedCluster(2) as cluster:
        with pytest.raises(ValueError, match="--shared-hosts places 2 ranks but this run has 3"):
            with emulated_sites([0, 1, 2], "1gbit", "1mb", cluster.share([0, 1], master_host=0)):
                pass


class RecordingCluster(EmulatedCluster):
    """The run's own cluster, noting its qdiscs' figures just before it is taken down."""

    closed: list[dict[str, dict[str, Any]]] = []

    def __exit__(self, *exc: object) -> None:
        RecordingCluster.closed.append(qdisc_stats(self))
        super().__exit__(*exc)


@pytest.mark.slow  # one 100mbit training step moving ~90 MB (~8 s of traffic, ~30 s in all)
def test_a_100mbit_training_run_stays_under_the_rate_on_every_shaped_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequential ps, 1 worker (host 0) and 1 PS (host 1), through the driver, which builds its own cluster."""
    monkeypatch.setattr(emulated, "EmulatedCluster", RecordingCluster)
    RecordingCluster.closed = []
    overrides = [
        "cluster=emulated",
        "network=100mbit",
        "model=resnet18",
        "strategy=ps",
        "strategy.overlap=false",
        "cluster.gpus=1",
        "dataset.num_classes=10",
        "train.batch_size=2",
        "train.image_size=32",
        "train.warmup_steps=0",
        "train.measure_steps=1",
        "train.loader=synthetic",
    ]
    metrics = run(load(overrides), tmp_path / "run")
    assert metrics is not None and metrics.roles == ["worker", "ps"]
    [qdiscs] = RecordingCluster.closed
    steps = pd.read_parquet(tmp_path / "run" / STEPS_FILE).set_index("rank")
    push = int(steps.loc[0, "bytes_gradients"])  # the worker's gradients up host 0's link
    pull = int(steps.loc[1, "bytes_parameters"])  # the PS's parameters down it
    assert push == pull > 40e6  # ResNet-18's 11.2 M parameters as float32, each way

    # Both ends of each host link are tbf at the configured rate and carried that direction's bytes:
    # the upload shaper (h<i>, the host's eth0) and the download one (s<i>, the switch's port).
    rate = rate_bits_per_s("100mbit") / 8
    assert sorted(qdiscs) == ["h0", "h1", "s0", "s1"]
    assert {(q["kind"], q["rate"]) for q in qdiscs.values()} == {("tbf", rate)}, qdiscs
    for side, carried in (("h0", push), ("s1", push), ("h1", pull), ("s0", pull)):
        assert qdiscs[side]["bytes"] >= carried, (side, qdiscs[side], carried)

    # The physical bound. Without overlap the PS returns parameters only once every gradient byte
    # has arrived, so push and pull cross the link one after the other, each at most at the payload
    # rate: a 1514-byte frame the tbf counts carries 1448 payload bytes (TCP_PAYLOAD_PER_WIRE_BYTE).
    # The worker is blocked (comm_wait_s) for all of it except pushes posted while backward still ran,
    # which lie within the step's compute_s; each direction's shapers start with at most one full
    # bucket (the burst tc reports) that passes unshaped.
    payload_rate = rate * TCP_PAYLOAD_PER_WIRE_BYTE
    comm, compute = float(steps.loc[0, "comm_wait_s"]), float(steps.loc[0, "compute_s"])
    # the PS's initial buckets (sent before the first step) are in no step's bytes or wait
    assert 0 < compute and int(steps.loc[0, "bytes_parameters"]) == 0, steps
    bursts = 2 * qdiscs["h0"]["burst"]
    achieved = (push + pull - bursts) * 8 / (comm + compute)
    assert achieved <= payload_rate * 8, f"{achieved / 1e6:.1f} Mbit/s ({comm=:.2f} s, {compute=:.2f} s) on 100mbit"

    counted, wire = metrics.gb_per_step["total"], metrics.wire_gb_per_step
    assert wire is not None and counted <= wire <= 1.05 * counted, (counted, wire)  # TCP/IP headers on top
    assert metrics.wire_per_host is not None and sorted(metrics.wire_per_host) == ["h0", "h1"]
