"""The nodes of a SLURM allocation and which of them each rank runs on (no torch import: the workflow uses it
at parse time).

:func:`node_of_ranks` is the one owner of that decision: the launcher writes it into the srun
host file and the SLURM resources ask for :func:`nodes_needed` nodes. :func:`allocation_nodes` names a
job's nodes in its node order (:func:`node_names` expands a node list such as ``node[03-05,9]``).

- Without GPUs (``gpus_per_node=0``) every host of :attr:`Topology.hosts` is a node of its own,
  as on the emulated cluster: rank r on node r, a colocated PS rank on its worker's node.
- With ``gpus_per_node=G`` every rank holds a GPU of its own (srun gives each task one, and NCCL
  refuses two ranks on one device), so a node takes at most G ranks. Workers and RALP's PS device
  fill nodes in rank order; a colocated ``ps`` rank travels with its worker (the worker and the PS
  ranks it hosts start a new node together where they no longer fit); a dedicated ``ps`` rank gets
  a node of its own after them.
"""

from __future__ import annotations

import os
import subprocess

from ralp_pipe.contract.topology import PS, Topology
from ralp_pipe.errors import ConfigError, RunFailure


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


def allocation_nodes(job: str) -> list[str]:
    """Node names of SLURM job `job`, in its node order: from SLURM_JOB_NODELIST, or from ``squeue`` where
    that is unset (snakemake's jobstep executor removes it before running a rule's command)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        try:
            nodelist = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise RunFailure(
                f"cannot find the nodes of SLURM job {job} (no SLURM_JOB_NODELIST; squeue: {exc})"
            ) from exc
    return node_names(nodelist)


def first_host(nodelist: str) -> str:
    """First host name of a SLURM node list such as ``node[03-05,9]``."""
    return node_names(nodelist)[0]


def node_names(nodelist: str) -> list[str]:
    """Host names of a SLURM node list such as ``node[03-05,9]`` (via ``scontrol show hostnames``)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RunFailure(f"cannot expand SLURM node list {nodelist!r} with scontrol: {exc}") from exc
    hosts = out.split()
    if not hosts:
        raise RunFailure(f"SLURM node list {nodelist!r} expands to no host")
    return hosts
