"""Ranks, roles and hosts of every strategy, dedicated and colocated PS placement."""

from __future__ import annotations

import pytest

from ralp_pipe.contract.topology import PS, PS_DEVICE, WORKER, topology
from ralp_pipe.engine.strategies import holds_model


def test_dedicated_ps_ranks_are_hosts_of_their_own() -> None:
    topo = topology("ps", 4, num_ps=2)
    assert topo.roles == [WORKER] * 4 + [PS] * 2
    assert topo.hosts == [0, 1, 2, 3, 4, 5] and topo.num_hosts == 6


def test_colocated_ps_rank_i_shares_worker_i_host_and_wraps_beyond_the_workers() -> None:
    topo = topology("ps", 3, num_ps=4, ps_placement="colocated")
    assert topo.ps == [3, 4, 5, 6]
    assert topo.hosts == [0, 1, 2, 0, 1, 2, 0] and topo.num_hosts == 3
    assert topo.ranks_on(0) == [0, 3, 6]


@pytest.mark.parametrize("strategy", ["allreduce", "ralp_h", "ralp_n"])
def test_placement_leaves_strategies_without_ps_processes_alone(strategy: str) -> None:
    dedicated, colocated = topology(strategy, 4), topology(strategy, 4, ps_placement="colocated")
    assert colocated.hosts == dedicated.hosts == list(range(dedicated.world_size))
    if strategy != "allreduce":
        assert colocated.roles[-1] == PS_DEVICE


def test_unknown_placement_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ps_placement 'shared'"):
        topology("ps", 2, ps_placement="shared")


@pytest.mark.parametrize(
    ("strategy", "gpus", "workers", "world"),
    [
        ("ps", 3, 3, 4),
        ("allreduce", 3, 3, 3),
        ("ralp_h", 2, 1, 2),
        ("ralp_h", 3, 2, 3),  # half of 3 devices rounds up: no device left idle
        ("ralp_h", 4, 2, 3),
        ("ralp_h", 8, 4, 5),
        ("ralp_n", 3, 2, 3),
        ("ralp_n", 4, 3, 4),
    ],
)
def test_worker_counts_follow_the_strategy_table(strategy: str, gpus: int, workers: int, world: int) -> None:
    topo = topology(strategy, gpus)
    assert (topo.num_workers, topo.world_size) == (workers, world)


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
def test_only_ps_server_ranks_build_no_model(placement: str) -> None:
    """A `ps` PS rank holds only its buckets (initialised from worker 0); RALP's PS device computes, so it builds one."""
    ps = topology("ps", 2, num_ps=2, ps_placement=placement)
    assert [holds_model(ps, rank) for rank in range(ps.world_size)] == [True, True, False, False]
    ralp = topology("ralp_n", 3)
    assert all(holds_model(ralp, rank) for rank in range(ralp.world_size))
