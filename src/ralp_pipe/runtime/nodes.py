"""Which SLURM node of an allocation each rank runs on (no torch import: the workflow uses it at parse time).

:func:`node_of_ranks` is the one owner of that decision: the launcher writes it into the srun
host file and the SLURM resources ask for :func:`nodes_needed` nodes.

- Without GPUs (``gpus_per_node=0``) every host of :attr:`Topology.hosts` is a node of its own,
  as on the emulated cluster: rank r on node r, a colocated PS rank on its worker's node.
- With ``gpus_per_node=G`` the device ranks (workers and RALP's PS device) fill G per node in rank
  order; a ``ps`` rank shares its worker's node when colocated, else gets a node of its own after them.
"""

from __future__ import annotations

from ralp_pipe.engine.topology import PS, Topology


def node_of_ranks(topo: Topology, gpus_per_node: int) -> list[int]:
    """Node index (0-based, in the allocation's node order) of every rank of `topo`."""
    if gpus_per_node <= 0:
        return list(topo.hosts)
    device_ranks = [rank for rank, role in enumerate(topo.roles) if role != PS]
    nodes = [0] * topo.world_size
    for slot, rank in enumerate(device_ranks):
        nodes[rank] = slot // gpus_per_node
    next_free = -(-len(device_ranks) // gpus_per_node)
    for rank in topo.ps:
        if topo.roles[rank] != PS:
            continue
        host = topo.hosts[rank]
        if host != rank:  # colocated: shares the host of worker `host`
            nodes[rank] = nodes[host]
        else:
            nodes[rank] = next_free
            next_free += 1
    return nodes


def nodes_needed(topo: Topology, gpus_per_node: int) -> int:
    """How many nodes the ranks of `topo` occupy."""
    return max(node_of_ranks(topo, gpus_per_node)) + 1
