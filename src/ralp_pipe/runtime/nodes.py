"""Which SLURM node of an allocation each rank runs on (no torch import: the workflow uses it at parse time).

:func:`node_of_ranks` is the one owner of that decision: the launcher writes it into the srun
host file and the SLURM resources ask for :func:`nodes_needed` nodes.

- Without GPUs (``gpus_per_node=0``) every host of :attr:`Topology.hosts` is a node of its own,
  as on the emulated cluster: rank r on node r, a colocated PS rank on its worker's node.
- With ``gpus_per_node=G`` every rank holds a GPU of its own (srun gives each task one, and NCCL
  refuses two ranks on one device), so a node takes at most G ranks. Workers and RALP's PS device
  fill nodes in rank order; a colocated ``ps`` rank travels with its worker (the worker and the PS
  ranks it hosts start a new node together where they no longer fit); a dedicated ``ps`` rank gets
  a node of its own after them.
"""

from __future__ import annotations

from ralp_pipe.contract.topology import PS, Topology
from ralp_pipe.errors import ConfigError


def node_of_ranks(topo: Topology, gpus_per_node: int) -> list[int]:
    """Node index (0-based, in the allocation's node order) of every rank of `topo`."""
    if gpus_per_node <= 0:
        return list(topo.hosts)
    guests = {rank: [p for p in topo.ps if topo.roles[p] == PS and topo.hosts[p] == rank] for rank in topo.workers}
    nodes = [0] * topo.world_size
    node, used = 0, 0
    for rank in (r for r, role in enumerate(topo.roles) if role != PS):
        group = [rank, *guests.get(rank, [])]
        if len(group) > gpus_per_node:
            raise ConfigError(
                f"{topo.strategy} with strategy.ps_placement=colocated puts {len(group)} ranks (worker {rank} and "
                f"its PS ranks) on one node, each with a GPU, but cluster.slurm.gpus_per_node={gpus_per_node}: "
                f"lower strategy.num_ps or use strategy.ps_placement=dedicated"
            )
        if used + len(group) > gpus_per_node:
            node, used = node + 1, 0
        for member in group:
            nodes[member] = node
        used += len(group)
    next_free = node + 1
    for rank in topo.ps:
        if topo.roles[rank] == PS and topo.hosts[rank] == rank:  # dedicated: a node of its own
            nodes[rank] = next_free
            next_free += 1
    return nodes


def nodes_needed(topo: Topology, gpus_per_node: int) -> int:
    """How many nodes the ranks of `topo` occupy."""
    return max(node_of_ranks(topo, gpus_per_node)) + 1
