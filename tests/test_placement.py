"""One placement of ranks on hosts: what the plan prices is what SLURM's job and srun lay out (nodes of
``cluster.gpus_per_node`` GPUs), RALP's PS device where the plan put it."""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import lru_cache
from typing import Any

import pytest

from ralp_pipe.config import Config, StrategyConfig, load
from ralp_pipe.contract.topology import PS, PS_DEVICE_HOSTS, Hosts, gpu_slots, on_hosts, placement, topology
from ralp_pipe.engine import models
from ralp_pipe.planning.costmodel import Link, Pricing, compute_costs
from ralp_pipe.planning.planner import plan_gpus, strategy_pricing, volume_function, whole_variables
from ralp_pipe.runtime import devices
from ralp_pipe.runtime.nodes import gpus_per_node_used, node_of_ranks, requests_gpus
from ralp_pipe.workflow.slurm import job_resources, ranks_per_node
from support.profiles import analytic_profile

G, N = 2, 4  # nodes of 2 GPUs, 4 GPUs in all
SLURM = ["cluster=slurm", "network=fabric", f"cluster.gpus_per_node={G}", "interconnect=nvlink2", f"cluster.gpus={N}"]
CASES = {  # what each strategy's run sets beside SLURM
    "ps": ["strategy=ps", "strategy.num_ps=2", "strategy.ps_placement=colocated"],
    "ralp_n": ["strategy=ralp_n"],
    "dtf": ["strategy=dtf"],
    "allreduce": ["strategy=allreduce"],
}


def _slurm(strategy: str, *more: str) -> Config:
    return load([*SLURM, *CASES[strategy], *more])


@lru_cache(maxsize=None)
def _pricing() -> tuple[Pricing, tuple[models.Unit, ...]]:
    """VGG-11/1K at 32 px, batch 8, an analytic device, 10 Gbit/s, on hosts of G; `ps` with 2 PS ranks beside the
    workers."""
    units = models.model_units("vgg11", 1000, 0.5, "meta")
    profile = analytic_profile("vgg11", 1000, 32, [8, 56, 64], 5e12, None, 5e11)
    variables = whole_variables(units, StrategyConfig(name="dtf"))
    pricing = Pricing(compute_costs(profile), 8, Link(10e9 / 8), num_ps=2, colocated=True, variables=variables)
    return dataclasses.replace(pricing, hosts=Hosts(G, 150e9)), tuple(units)


@lru_cache(maxsize=None)
def _plan() -> dict[str, dict[str, Any]]:
    """The plan's entries at N on hosts of G (:func:`_pricing`)."""
    pricing, units = _pricing()
    return plan_gpus([u.name for u in units], volume_function(list(units), 8, 32, 2), N, pricing)


def _priced_hosts(strategy: str, entry: dict[str, Any]) -> list[int]:
    """The hosts the cost model priced `entry` on: its strategy's ranks as the planner prices them on hosts of G,
    RALP's PS device where the plan chose."""
    p = strategy_pricing(strategy, N, _pricing()[0])
    topo = topology(strategy, N, p.num_ps, "colocated" if p.colocated else "dedicated")
    return on_hosts(topo, p.hosts.gpus_per_node, entry.get("ps_device_host") == PS_DEVICE_HOSTS[True]).hosts


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(CASES))
def test_the_srun_layout_is_the_plans_placement(strategy: str) -> None:
    entry = _plan()[strategy]
    cfg = _slurm(strategy)
    topo = placement(cfg, entry.get("ps_device_host"))  # what train lays out from the plan, on every launcher
    assert (topo.world_size, topo.roles) == (entry["world_size"], entry["roles"])
    assert node_of_ranks(topo) == topo.hosts == _priced_hosts(strategy, entry)
    # RALP: each place of the PS device the plan priced (here it chose a worker host) is the one srun would lay out
    choices = {row.get("ps_device_host") for row in entry.get("table", [entry])}
    assert choices == (set(PS_DEVICE_HOSTS.values()) if strategy == "ralp_n" else {None})
    for choice in choices:
        assert node_of_ranks(placement(cfg, choice)) == _priced_hosts(strategy, {"ps_device_host": choice})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "ps_device_host", "hosts", "per_node"),
    [
        # 4 workers fill 2 nodes; PS rank i on worker host i mod 2, beside them (3 ranks a node), as the plan prices
        ("ps", None, [0, 0, 1, 1, 0, 1], [3, 3]),
        # 3 workers, then RALP's PS device on a node of its own
        ("ralp_n", PS_DEVICE_HOSTS[False], [0, 0, 1, 2], [2, 1, 1]),
        # one PS task per worker host (2 of the strategy table's 4 kept), beside its workers
        ("dtf", None, [0, 0, 1, 1, 0, 1], [3, 3]),
        ("allreduce", None, [0, 0, 1, 1], [2, 2]),
    ],
)
def test_slurm_asks_for_the_nodes_of_the_placement(
    strategy: str, ps_device_host: str | None, hosts: list[int], per_node: list[int]
) -> None:
    cfg = _slurm(strategy)
    topo = placement(cfg, ps_device_host)
    assert node_of_ranks(topo) == hosts
    assert ranks_per_node(cfg) == per_node == [Counter(hosts)[n] for n in range(max(hosts) + 1)]
    resources = job_resources(cfg, "train")
    assert (resources["nodes"], resources["tasks"]) == (len(per_node), sum(per_node))
    assert "gres" not in resources and not requests_gpus(cfg.cluster)  # device auto: CPU nodes, no GPU asked


def test_ralp_ps_device_beside_workers_needs_no_node_more_than_the_job_has() -> None:
    cfg = _slurm("ralp_n")
    beside = placement(cfg, PS_DEVICE_HOSTS[True])
    assert beside.hosts == [0, 1, 1, 0]  # the PS device in host 0's first slot, beside worker 0
    assert gpu_slots(beside, G) == [1, 0, 1, 0]
    assert max(node_of_ranks(beside)) + 1 <= len(ranks_per_node(cfg))  # the job is sized for the PS device alone


@pytest.mark.slow
def test_gpu_nodes_get_a_gpu_per_rank_and_ranks_beyond_them_share_over_gloo() -> None:
    cfg = _slurm("ps", "cluster.device=cuda")
    topo = placement(cfg)
    assert gpu_slots(topo, G) == [0, 1, 0, 1, 0, 0]  # workers first; each host's PS rank shares its first GPU
    assert gpus_per_node_used(topo, G) == [2, 2]
    resources = job_resources(cfg, "train")
    assert resources["gres"] == "gpu:2" and resources["slurm_extra"].endswith("--ntasks-per-node=3")
    assert devices.ranks_per_host(cfg.cluster, topo.world_size, topo.hosts) == 3  # 3 ranks on 2 GPUs: not NCCL
    assert devices.resolve_backend("auto", "cuda", 3) == "gloo"
    dedicated = placement(_slurm("ps", "cluster.device=cuda", "strategy.ps_placement=dedicated"))
    assert dedicated.hosts == [0, 0, 1, 1, 2, 3] and gpu_slots(dedicated, G) == [0, 1, 0, 1, 0, 0]
    assert devices.ranks_per_host(cfg.cluster, dedicated.world_size, dedicated.hosts) == 2


def test_ps_ranks_hold_no_gpu_in_the_cost_model_and_none_is_counted_twice() -> None:
    topo = on_hosts(topology("ps", 8, 3, "colocated"), 4)
    slots = gpu_slots(topo, 4)
    for host in set(topo.hosts):
        gpu_ranks = [r for r in topo.ranks_on(host) if topo.roles[r] != PS]
        assert sorted(slots[r] for r in gpu_ranks) == list(range(len(gpu_ranks)))  # a GPU of its own each
