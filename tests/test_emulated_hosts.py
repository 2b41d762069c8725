"""Emulated hosts of G GPUs: ranks fill hosts G at a time, RALP's PS device where the plan put it, a host's ranks
share its namespace and its one shaped link; at one GPU per host nothing changes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from ralp_pipe.config import load
from ralp_pipe.contract.layout import STEPS_FILE
from ralp_pipe.contract.topology import PS_DEVICE_HOSTS, links_of, of_strategy, on_hosts, placement, topology
from ralp_pipe.engine.train import meta_units, run
from ralp_pipe.engine.volume import host_groups, push_pull_link_bytes, variable_owners
from ralp_pipe.runtime import emulated
from ralp_pipe.runtime.emulated import EmulatedCluster, emulated_sites, intra_host_record
from ralp_pipe.runtime.launch import PythonMain, launch_local
from ralp_pipe.workflow.matrix import Matrix, parse_settings
from support.emulated_hosts import qdisc_stats

HOSTS_OF_4 = ["cluster=emulated", "cluster.gpus_per_node=4", "interconnect=pcie3"]


@pytest.mark.parametrize(
    ("strategy", "gpus", "kwargs"),
    [("allreduce", 8, {}), ("ralp_n", 8, {}), ("ralp_h", 5, {}), ("ps", 4, {"num_ps": 2}), ("dtf", 3, {})],
)
def test_one_gpu_per_host_leaves_the_topology_as_it_was(strategy: str, gpus: int, kwargs: dict[str, Any]) -> None:
    topo = topology(strategy, gpus, **kwargs)
    assert on_hosts(topo, 1) is topo and on_hosts(topo, 1, ps_device_shares_host=True) is topo


def test_workers_fill_hosts_g_at_a_time_so_the_ring_leaves_each_host_once() -> None:
    topo = on_hosts(topology("allreduce", 8), 4)
    assert topo.hosts == [0, 0, 0, 0, 1, 1, 1, 1] and topo.num_hosts == 2
    crossings = sum(topo.hosts[r] != topo.hosts[(r + 1) % 8] for r in range(8))
    assert crossings == 2  # one hop out of each host: what NCCL's ring and the cost model's price
    assert on_hosts(topology("allreduce", 6), 4).hosts == [0, 0, 0, 0, 1, 1]


def test_the_ps_device_has_a_host_of_its_own_or_shares_host_0_with_g_minus_1_workers() -> None:
    own = on_hosts(topology("ralp_n", 8), 4)
    assert own.roles[-1] == "ps_device" and own.hosts == [0, 0, 0, 0, 1, 1, 1, 2]
    shared = on_hosts(topology("ralp_n", 8), 4, ps_device_shares_host=True)
    assert shared.hosts == [0, 0, 0, 1, 1, 1, 1, 0] and shared.num_hosts == 2
    # the cost model's local workers: min(G - 1, W) beside the PS device
    assert on_hosts(topology("ralp_h", 8), 4, ps_device_shares_host=True).hosts == [0, 0, 0, 1, 0]
    assert on_hosts(topology("ralp_n", 2), 4, ps_device_shares_host=True).hosts == [0, 0]


def test_ps_ranks_stay_colocated_or_dedicated_on_hosts_of_several_gpus() -> None:
    dedicated = on_hosts(topology("ps", 8, 2), 4)
    assert dedicated.hosts == [0, 0, 0, 0, 1, 1, 1, 1, 2, 3]
    colocated = on_hosts(topology("ps", 8, 3, "colocated"), 4)
    assert colocated.hosts == [0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0]
    with pytest.raises(ValueError, match="gpus_per_node=0"):
        on_hosts(dedicated, 0)


@pytest.mark.slow
def test_the_emulated_layout_follows_the_plans_ps_device_choice() -> None:
    cfg = load([*HOSTS_OF_4, "strategy=ralp_n", "cluster.gpus=8"])
    topo = of_strategy(cfg.strategy, 8)
    beside = placement(cfg, PS_DEVICE_HOSTS[True])
    alone = placement(cfg, PS_DEVICE_HOSTS[False])
    assert beside.num_hosts == 2 and alone.num_hosts == 3 and placement(cfg).hosts == alone.hosts
    record = intra_host_record(cfg, beside)
    assert record is not None and record["ps_device_host"] == PS_DEVICE_HOSTS[True]
    assert record["host_of_rank"] == beside.hosts and record["route"] == "loopback"
    assert record["hosts"] == 2 and record["gpus_per_node"] == 4
    for dilated, sums in (
        (["dilation.factor=null"], "copied"),
        (["dilation.factor=8", "dilation.mode=modelled"], "priced"),
    ):
        ps = intra_host_record(load([*HOSTS_OF_4, "strategy=ps", "cluster.gpus=8", *dilated]), topo)
        assert ps is not None and ps["host_sums"] == sums  # computing ranks copy their sums; modelled ones wait
    assert intra_host_record(load(["cluster=emulated", "strategy=ralp_n"]), topo) is None
    assert links_of(cfg) == (3, "star")


@pytest.mark.slow
def test_parameter_servers_on_hosts_of_several_gpus_push_once_per_host() -> None:
    cfg = load([*HOSTS_OF_4, "strategy=ps", "cluster.gpus=8"])
    ps = placement(cfg)
    assert ps.hosts == [0, 0, 0, 0, 1, 1, 1, 1, 2] and host_groups(ps) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cfg = load([*HOSTS_OF_4, "strategy=dtf", "cluster.gpus=8"])
    dtf = placement(cfg)
    assert dtf.ps == [8, 9] and dtf.hosts == [0, 0, 0, 0, 1, 1, 1, 1, 0, 1]  # a PS task per host, as priced
    assert links_of(cfg) == (2, "ring")  # a PS task on both hosts: every link at once


class RecordingCluster(EmulatedCluster):
    """The run's own cluster, noting its qdiscs' figures just before it is taken down."""

    closed: list[dict[str, dict[str, Any]]] = []

    def __exit__(self, *exc: object) -> None:
        RecordingCluster.closed.append(qdisc_stats(self))
        super().__exit__(*exc)


@pytest.mark.netns
@pytest.mark.slow  # two clusters of 2 hosts; one RALP step of ResNet-18 at 32 px (~25 s)
def test_two_ranks_of_a_host_share_its_namespace_and_its_one_shaped_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = on_hosts(topology("allreduce", 4), 2).hosts
    with emulated_sites(layout, "1gbit", "1mb") as sites:
        launch_local(PythonMain("support.netns_rank", (str(tmp_path),)), 4, 120, tmp_path, sites=sites)
    ranks = [(tmp_path / str(r)).read_text().split() for r in range(4)]
    assert [r[0] for r in ranks] == ["0", "0", "1", "1"]  # each rank's host index
    assert ranks[0][3] == ranks[1][3] != ranks[2][3] == ranks[3][3] != os.readlink("/proc/self/ns/net")

    # RALP-N at N=3 on hosts of 2: both workers on host 0, the PS device alone on host 1 (no plan)
    monkeypatch.setattr(emulated, "EmulatedCluster", RecordingCluster)
    RecordingCluster.closed = []
    overrides = ["cluster=emulated", "cluster.gpus_per_node=2", "interconnect=pcie3", "network=1gbit"]
    overrides += ["model=resnet18", "strategy=ralp_n", "cluster.gpus=3", "dataset.num_classes=10"]
    overrides += ["train.batch_size=2", "train.image_size=32", "train.warmup_steps=0", "train.measure_steps=1"]
    metrics = run(load([*overrides, "train.loader=synthetic"]), tmp_path / "run")
    assert metrics is not None and metrics.intra_host is not None
    assert metrics.intra_host["host_of_rank"] == [0, 0, 1]
    assert metrics.intra_host["ps_device_host"] == PS_DEVICE_HOSTS[False]
    [qdiscs] = RecordingCluster.closed
    assert sorted(qdiscs) == ["h0", "h1", "s0", "s1"]  # two host links, not one per rank
    steps = pd.read_parquet(tmp_path / "run" / STEPS_FILE).set_index("rank")
    sent = steps[[c for c in steps.columns if c.startswith("bytes_")]].sum(axis=1)
    # host 0's one upload shaper carried what both of its workers sent, more than either alone
    assert qdiscs["h0"]["bytes"] >= sent[0] + sent[1] > max(sent[0], sent[1]) > 0, (qdiscs["h0"], sent)
    assert metrics.wire_per_host is not None and sorted(metrics.wire_per_host) == ["h0", "h1"]


@pytest.mark.netns
@pytest.mark.slow  # two runs of 4 workers on 2 hosts of 2, ResNet-18 at 32 px (~35 s)
@pytest.mark.parametrize("strategy", ["ps", "dtf"])
def test_a_hosts_workers_sum_before_one_push_and_only_that_crosses_its_link(tmp_path: Path, strategy: str) -> None:
    overrides = ["cluster=emulated", "cluster.gpus_per_node=2", "interconnect=pcie3", "network=1gbit"]
    overrides += ["model=resnet18", f"strategy={strategy}", "cluster.gpus=4", "dataset.num_classes=10"]
    overrides += ["train.batch_size=2", "train.image_size=32", "train.warmup_steps=1", "train.measure_steps=2"]
    cfg = load([*overrides, "train.loader=synthetic"])
    metrics = run(cfg, tmp_path / "run")
    assert metrics is not None and metrics.intra_host is not None and metrics.wire_per_host is not None
    topo = placement(cfg)
    assert metrics.intra_host["host_of_rank"] == topo.hosts and metrics.world_size == topo.world_size
    for category in ("total", "gradients", "parameters"):  # every byte the ranks sent, the sums inside hosts too
        assert metrics.gb_per_step[category] == pytest.approx(metrics.analytic_gb_per_step[category], rel=1e-9)
    sizes = [4 * p.numel() for u in meta_units(cfg) for p in u.module.parameters()]
    owners = [0] * len(sizes) if strategy == "ps" else variable_owners(sizes, len(topo.ps))
    loads = {rank: sum(s for s, o in zip(sizes, owners) if o == task) for task, rank in enumerate(topo.ps)}
    links = push_pull_link_bytes(topo, loads)
    assert sum(link["tx"] for link in links.values()) <= metrics.analytic_gb_per_step["total"] * 1e9 / 2
    for host, link in links.items():  # payload, plus TCP/IP headers (under 5% at these message sizes)
        measured = metrics.wire_per_host[f"h{host}"]
        for way in ("tx", "rx"):
            assert link[way] / 1e9 <= measured[way] <= 1.05 * link[way] / 1e9, (host, way, measured, link)


@pytest.mark.slow  # composes the hosts experiment's 48-run matrix (~2 s)
def test_the_hosts_experiment_runs_every_strategy_at_n_8_on_hosts_of_4() -> None:
    """experiment=hosts-dilated: each of its runs, the N = 1 references aside, on 2 hosts of 4 behind PCIe 3.0
    and one 10 Gbit/s link each, every baseline and RALP at N = 8, each configuration twice."""
    matrix = Matrix(parse_settings({"experiment": "hosts-dilated"}))
    runs = [entry for entry in matrix.runs if entry.gpus > 1]
    strategies = {"ps", "dtf", "byteps", "allreduce", "ralp_h", "ralp_n"}
    assert {(e.model, e.strategy, e.gpus, e.network) for e in runs} == {
        (model, strategy, 8, "10gbit") for model in ("vgg16", "resnet50") for strategy in strategies
    }
    assert len(runs) == 2 * len(strategies) * 2
    for entry in runs:
        cfg = matrix.config(entry)
        assert (cfg.cluster.gpus_per_node, cfg.interconnect.name, cfg.dilation.factor) == (4, "pcie3", 8)
