"""`byteps`: `ps` as BytePS deploys it (a PS on every worker host beside its workers, tensors partitioned over all
of them), in the strategy table, the topology, the planner, the tables and, on emulated hosts, on the wire."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ralp_pipe.config import STRATEGY_KINDS, ConfigError, load, reference_baseline, strategy_kind
from ralp_pipe.contract.topology import Hosts, of_strategy, on_hosts, placement
from ralp_pipe.engine import models
from ralp_pipe.engine.strategies.base import bucket_elements, plan_buckets
from ralp_pipe.engine.train import meta_units, run
from ralp_pipe.engine.volume import push_pull_link_bytes
from ralp_pipe.planning.costmodel import Link, Pricing, compute_costs
from ralp_pipe.planning.planner import (
    best_prediction,
    per_host_placements,
    plan_gpus,
    volume_function,
    whole_variables,
)
from ralp_pipe.results.aggregate import build_tables, load_records
from ralp_pipe.workflow.matrix import Matrix, parse_settings
from support.profiles import analytic_profile
from workflow_records import PAPER_FOUR, write_results

GBIT = 1e9 / 8
NVLINK = 150e9  # bytes/s: an interconnect far faster than the link


def test_byteps_is_ps_with_a_server_beside_the_workers_of_every_host() -> None:
    byteps, ps = strategy_kind("byteps"), strategy_kind("ps")
    assert byteps.step_class is ps.step_class and byteps.volume_function is ps.volume_function
    assert byteps.trainable and byteps.baseline and byteps.ps_per_host and not byteps.whole_variables
    assert reference_baseline() == "ps" and [n for n, k in STRATEGY_KINDS.items() if k.reference] == ["ps"]
    cfg = load(["strategy=byteps"])
    assert cfg.strategy.ps_placement == "colocated"
    topo = of_strategy(cfg.strategy, 4)  # one GPU per host: a server on each of the 4 hosts
    assert topo.roles == ["worker"] * 4 + ["ps"] * 4 and topo.hosts == [0, 1, 2, 3, 0, 1, 2, 3]
    two = on_hosts(topo, 2)  # hosts of 2 GPUs: one server per host, not per GPU
    assert two.world_size == 6 and two.hosts == [0, 0, 1, 1, 0, 1]


@pytest.mark.slow
def test_each_strategy_with_a_server_per_host_takes_its_own_placement() -> None:
    assert per_host_placements(load([])) == {"dtf": True, "byteps": True}
    dedicated = load(["strategy=byteps", "strategy.ps_placement=dedicated"])
    assert per_host_placements(dedicated) == {"dtf": True, "byteps": False}


def _vgg11() -> tuple[Pricing, list[models.Unit]]:
    """VGG-11/1K at 32 px, batch 8, on a fast analytic device and a 10 Gbit/s link, and its placement units."""
    units = models.model_units("vgg11", 1000, 0.5, "meta")  # sizes only: nothing initialised
    profile = analytic_profile("vgg11", 1000, 32, [8, 56, 64], 5e12, None, 5e11)
    variables = whole_variables(units, load(["strategy=dtf"]).strategy)
    return Pricing(compute_costs(profile), 8, Link(10 * GBIT), variables=variables), units


def test_the_planner_prices_byteps_as_ps_with_one_server_per_host_and_every_speedup_over_it() -> None:
    base, units = _vgg11()
    names = [u.name for u in units]
    volume = volume_function(units, 8, 32, 1)
    pricing = dataclasses.replace(base, hosts=Hosts(4, NVLINK))
    entries = plan_gpus(names, volume, 8, pricing)
    beside, _ = best_prediction("ps", volume, 8, dataclasses.replace(pricing, num_ps=2, colocated=True))
    byteps = entries["byteps"]
    assert byteps["predicted_images_per_sec"] == beside.images_per_sec
    assert (byteps["world_size"], byteps["roles"].count("ps")) == (10, 2)  # 8 workers + a server on each host
    assert byteps["predicted_images_per_sec"] > entries["ps"]["predicted_images_per_sec"]  # 2 links, not 1
    apart = plan_gpus(names, volume, 8, pricing, {"byteps": False})["byteps"]
    own, _ = best_prediction("ps", volume, 8, dataclasses.replace(pricing, num_ps=2, colocated=False))
    assert apart["predicted_images_per_sec"] == own.images_per_sec
    for strategy, entry in entries.items():
        for baseline in ("ps", "dtf", "byteps", "allreduce"):
            want = entry["predicted_images_per_sec"] / entries[baseline]["predicted_images_per_sec"]
            assert entry[f"speedup_over_{baseline}"] == pytest.approx(want), (strategy, baseline)
        assert (entry["pays"] is None) == strategy_kind(strategy).baseline
    ralp_n = entries["ralp_n"]
    assert ralp_n["pays"] == (ralp_n["speedup_over_ps"] > 1) and "the ps baseline's" in ralp_n["reason"]


@pytest.mark.slow
def test_the_tables_give_the_speedup_over_byteps_where_it_ran(tmp_path: Path) -> None:
    runs = write_results(
        tmp_path, models=("vgg11",), strategies=(*PAPER_FOUR, "dtf", "byteps"), gpus=(4,), networks=("1gbit",)
    )
    tables = build_tables(load_records(runs, [tmp_path / "plans"]))
    frame = tables.runs.set_index("strategy")
    want = frame.loc["ralp_n", "images_per_sec"] / frame.loc["byteps", "images_per_sec"]
    assert frame.loc["ralp_n", "speedup_vs_byteps"] == pytest.approx(want)
    assert frame.loc["byteps", "num_ps"] == 4  # a server beside each of the 4 workers
    header = next(line for line in tables.summary.splitlines() if line.startswith("| model") and "vs ps" in line)
    assert header.rstrip().endswith("| vs ps | vs dtf | vs byteps | vs allreduce |")
    assert "over `ps`, over `dtf`, over `byteps` and over `allreduce`" in tables.summary


@pytest.mark.netns
@pytest.mark.slow  # 4 workers on 2 emulated hosts of 2, ResNet-18 at 32 px (~20 s)
def test_byteps_on_hosts_of_two_pushes_once_per_host_to_a_server_on_each(tmp_path: Path) -> None:
    overrides = ["cluster=emulated", "cluster.gpus_per_node=2", "interconnect=pcie3", "network=1gbit"]
    overrides += ["model=resnet18", "strategy=byteps", "cluster.gpus=4", "dataset.num_classes=10"]
    overrides += ["train.batch_size=2", "train.image_size=32", "train.warmup_steps=1", "train.measure_steps=2"]
    cfg = load([*overrides, "train.loader=synthetic"])
    metrics = run(cfg, tmp_path / "run")
    assert metrics is not None and metrics.intra_host is not None and metrics.wire_per_host is not None
    topo = placement(cfg)
    assert metrics.intra_host["host_of_rank"] == topo.hosts == [0, 0, 1, 1, 0, 1]
    assert metrics.world_size == 6 and metrics.num_ps == 2
    for category in ("total", "gradients", "parameters"):
        assert metrics.gb_per_step[category] == pytest.approx(metrics.analytic_gb_per_step[category], rel=1e-9)
    sizes = [p.numel() for u in meta_units(cfg) for p in u.module.parameters()]
    buckets = plan_buckets(sizes, topo.ps, bucket_elements(cfg.strategy.bucket_mb, 4))
    loads = {server: 4 * sum(len(b) for b in buckets if b.server == server) for server in topo.ps}
    assert all(loads.values()) and sum(loads.values()) == 4 * sum(sizes)  # partitioned over both servers
    links = push_pull_link_bytes(topo, loads)
    for host, link in links.items():  # payload, plus TCP/IP headers (under 5% at these message sizes)
        measured = metrics.wire_per_host[f"h{host}"]
        for way in ("tx", "rx"):
            assert link[way] / 1e9 <= measured[way] <= 1.05 * link[way] / 1e9, (host, way, measured, link)


@pytest.mark.slow
def test_paper_dilated_runs_every_baseline_and_dtf_and_byteps_only_where_their_ranks_fit() -> None:
    matrix = Matrix(parse_settings({"experiment": "paper-dilated", "overrides": []}))
    ran = {(run.strategy, run.gpus) for run in matrix.runs}
    assert {s for s, _ in ran} >= {"ps", "dtf", "byteps", "allreduce", "ralp_n"}
    assert ("ps", 16) in ran and ("dtf", 16) not in ran and ("byteps", 16) not in ran and ("byteps", 8) in ran
    with pytest.raises(ConfigError, match="experiment.gpus_by_strategy"):
        load(["experiment=paper-dilated", "experiment.gpus_by_strategy={ralp_x: [2]}"])
    with pytest.raises(ConfigError, match=r"gpus_by_strategy.dtf=\[32\] has none of experiment.gpus"):
        load(["experiment=paper-dilated", "experiment.gpus_by_strategy={dtf: [32]}"])
    # narrowing the experiment to N = 16 refuses dtf and byteps (their entries stop at 8) until they are dropped
    with pytest.raises(ConfigError, match="drop it from experiment.strategies"):
        load(["experiment=paper-dilated", "experiment.gpus=[16]"])
    narrowed = load(["experiment=paper-dilated", "experiment.gpus=[16]", "experiment.strategies=[ps,ralp_n]"])
    assert narrowed.experiment.gpus_of("resnet50", "ps") == [16]
