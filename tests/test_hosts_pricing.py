"""Hosts of several GPUs behind one link (cluster.gpus_per_node, interconnect) and the `dtf` baseline, priced."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from ralp_pipe.config import ConfigError, StrategyConfig, from_dict, load, to_dict
from ralp_pipe.contract.topology import Hosts, topology
from ralp_pipe.engine import models
from ralp_pipe.planning.costmodel import (
    Link,
    Pipelining,
    Pricing,
    WholeVariables,
    compute_costs,
    predict,
    whole_variable_direction_bytes,
)
from ralp_pipe.planning.planner import best_prediction, plan_gpus, volume_function, whole_variables
from ralp_pipe.workflow.slurm import ranks_per_node
from support.profiles import analytic_profile

GBIT = 1e9 / 8
NVLINK = 150e9  # bytes/s: any interconnect far faster than the links below
STRATEGIES = ("ps", "allreduce", "dtf", "ralp_h", "ralp_n")


@lru_cache(maxsize=None)
def _vgg16() -> tuple[Pricing, list[models.Unit]]:
    """VGG-16/1K at 32 px, batch 8, on a fast analytic device, and its placement units."""
    units = models.model_units("vgg16", 1000, 0.5, "meta")  # sizes only: nothing initialised
    profile = analytic_profile("vgg16", 1000, 32, [8, 56, 64], 5e12, None, 5e11)
    variables = whole_variables(units, StrategyConfig(name="dtf"))
    return Pricing(compute_costs(profile), 8, Link(10 * GBIT), variables=variables), units


def _best(strategy: str, gpus: int, pricing: Pricing) -> float:
    """Images/sec of `strategy`'s best configuration at `gpus`."""
    _, units = _vgg16()
    volume = volume_function(units, 8, 32, pricing.num_ps)
    best, _ = best_prediction(strategy, volume, gpus, pricing)
    return best.images_per_sec


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overlap", [True, False])
def test_one_gpu_per_host_prices_as_before_whatever_the_interconnect(strategy: str, overlap: bool) -> None:
    base, _ = _vgg16()
    base = dataclasses.replace(base, pipelining=Pipelining(1e6) if overlap else None, ddp_overlap=overlap)
    with_interconnect = dataclasses.replace(base, hosts=Hosts(1, 1e9))
    assert _best(strategy, 8, with_interconnect) == _best(strategy, 8, base)


def test_one_host_of_eight_gpus_all_reduces_at_the_interconnect_not_the_network() -> None:
    base, _ = _vgg16()
    base = dataclasses.replace(base, ddp_overlap=False)
    one_host = dataclasses.replace(base, hosts=Hosts(8, NVLINK))
    slow, fast = (dataclasses.replace(one_host, link=Link(g * GBIT)) for g in (1, 100))
    workers, volume = 8, volume_function(_vgg16()[1], 8, 32, 1)("allreduce", 8, None)
    at_1, at_100 = (predict("allreduce", workers, 8, volume, p) for p in (slow, fast))
    assert at_1.step_time_s == at_100.step_time_s
    ring = 2 * 7 / 8 * base.costs.param_bytes / NVLINK
    assert at_1.comm_s == pytest.approx(ring)
    two_hosts = dataclasses.replace(slow, hosts=Hosts(4, NVLINK))  # the ring now leaves hosts on 1 Gbit/s
    assert predict("allreduce", 8, 8, volume, two_hosts).comm_s == pytest.approx(
        2 * 7 / 8 * base.costs.param_bytes / GBIT
    )


def test_dtf_with_vgg16_fc6_whole_on_one_ps_is_bound_by_that_ps_link() -> None:
    base, units = _vgg16()
    variables = base.variables
    assert variables is not None
    fc6 = max(variables.sizes)
    assert fc6 > 0.7 * base.costs.param_bytes  # VGG-16's first FC weight is most of the model
    hosts = 8
    loads = variables.loads(hosts)
    assert max(loads) >= fc6
    pricing = dataclasses.replace(base, num_ps=hosts, colocated=True)  # one PS task per host, G = 1
    volume = volume_function(units, 8, 32, hosts)("dtf", hosts, None)
    dtf = predict("dtf", hosts, hosts, volume, pricing)
    busiest = whole_variable_direction_bytes(loads, hosts, 1, colocated=True)
    assert busiest >= (hosts - 1) * fc6  # the fc6 host serves every other host's fc6 gradients
    assert dtf.comm_s >= 2 * busiest / base.link.bytes_per_s
    ps = predict("ps", hosts, hosts, volume_function(units, 8, 32, hosts)("ps", hosts, None), pricing)
    assert dtf.images_per_sec < ps.images_per_sec / 3  # partitioned tensors spread that load over every link
    greedy = dataclasses.replace(variables, greedy=True)
    assert max(greedy.loads(hosts)) >= fc6  # greedy cannot split fc6 either
    slower = dataclasses.replace(
        pricing, variables=dataclasses.replace(variables, transport_cap=base.link.bytes_per_s)
    )  # cap = rate: half of it
    assert predict("dtf", hosts, hosts, volume, slower).comm_s == pytest.approx(2 * dtf.comm_s)


def test_dtf_hosts_sum_their_gpus_before_pushing_unless_every_gpu_pushes() -> None:
    base, units = _vgg16()
    assert base.variables is not None
    pricing = dataclasses.replace(base, num_ps=2, colocated=True, hosts=Hosts(4, NVLINK))
    volume = volume_function(units, 8, 32, 2)("dtf", 8, None)
    summed = predict("dtf", 8, 8, volume, pricing)
    every_gpu = dataclasses.replace(pricing, variables=dataclasses.replace(base.variables, sum_in_host=False))
    assert predict("dtf", 8, 8, volume, every_gpu).comm_s > 3 * summed.comm_s


def test_ralp_ps_device_place_is_chosen_by_price_and_recorded() -> None:
    base, units = _vgg16()
    pricing = dataclasses.replace(base, hosts=Hosts(4, NVLINK), link=Link(1 * GBIT))
    volume = volume_function(units, 8, 32, 1)
    best, table = best_prediction("ralp_n", volume, 8, pricing)
    assert {p.ps_device_host for p in table} == {"a host of its own", "a worker host"}
    assert best.images_per_sec == max(p.images_per_sec for p in table)
    # on a slow link, three of the seven workers beside the PS device take their traffic off its link
    assert best.ps_device_host == "a worker host"
    assert best.as_dict()["ps_device_host"] == "a worker host"
    assert topology("ralp_n", 8).num_workers == 7


def test_a_plan_gives_dtf_the_ranks_it_runs_on_hosts_of_several_gpus() -> None:
    """One PS task per worker host: 8 workers on hosts of 4 run 2 tasks (10 ranks), as the engine starts them."""
    base, units = _vgg16()
    names = [u.name for u in units]
    entries = plan_gpus(names, volume_function(units, 8, 32, 1), 8, dataclasses.replace(base, hosts=Hosts(4, NVLINK)))
    assert (entries["dtf"]["world_size"], entries["dtf"]["roles"].count("ps")) == (10, 2)
    assert entries["ps"]["world_size"] == 9 and entries["allreduce"]["world_size"] == 8
    assert plan_gpus(names, volume_function(units, 8, 32, 1), 8, base)["dtf"]["world_size"] == 16  # a task per GPU


def test_hosts_fill_g_gpus_at_a_time_and_price_the_in_host_sum() -> None:
    hosts = Hosts(8, 16e9)
    assert [hosts.count(n) for n in (1, 8, 9, 64)] == [1, 1, 2, 8]
    assert hosts.in_host_s(16e9, summed=True) == pytest.approx(7 / 8)
    assert hosts.in_host_s(16e9, summed=False) == pytest.approx(1.0)
    assert Hosts().in_host_s(16e9, summed=False) == 0.0


def test_round_robin_places_variables_in_creation_order() -> None:
    variables = WholeVariables((5, 1, 1, 1, 4))
    assert variables.loads(2) == [5 + 1 + 4, 1 + 1]
    assert dataclasses.replace(variables, greedy=True).loads(2) == [5, 1 + 1 + 1 + 4]  # onto the least loaded


@pytest.mark.slow
def test_several_gpus_per_host_need_an_interconnect_and_one_key_says_how_many() -> None:
    with pytest.raises(ConfigError, match=r"cluster.gpus_per_node=4 but interconnect='none' has no bandwidth"):
        load(["cluster.gpus_per_node=4"])
    cfg = load(["cluster=slurm", "network=fabric", "cluster.gpus_per_node=4", "interconnect=nvlink2"])
    assert ranks_per_node(cfg) == [4, 1]  # SLURM's nodes are the hosts the plan prices: 4 workers, then the PS
    # the key SLURM's nodes had of their own is gone: an old config setting it is told what to set instead
    gone = r"^cluster.slurm.gpus_per_node is no longer a config key: set cluster.gpus_per_node .* cluster.device=cuda"
    with pytest.raises(ConfigError, match=gone):
        load(["cluster.slurm.gpus_per_node=4"])  # as an override
    with pytest.raises(ConfigError, match=gone):  # in a saved or hand-written configuration
        from_dict({**to_dict(cfg), "cluster": {**to_dict(cfg)["cluster"], "slurm": {"gpus_per_node": 4}}})
