"""The nodes of a SLURM allocation and which of them each rank runs on (no torch import: the workflow uses it
at parse time).

Which rank runs on which node is not decided here: a node is a host of the run's one placement
(:func:`ralp_pipe.contract.topology.placement`, hosts of ``cluster.gpus_per_node`` GPUs), the same the plan
prices and the emulator makes. :func:`node_of_ranks` reads it for the srun host file and the SLURM resources.
:func:`allocation_nodes` names a job's nodes in its node order (:func:`node_names` expands a node list
such as ``node[03-05,9]``).

Jobs ask SLURM for GPUs where ``cluster.device=cuda`` (:func:`requests_gpus`); with ``cpu`` or ``auto`` the nodes are
CPU nodes and nothing asks for a GPU.
"""

from __future__ import annotations

import os
import subprocess

from ralp_pipe.config import ClusterConfig
from ralp_pipe.contract.topology import Topology, gpu_slots
from ralp_pipe.errors import RunFailure


def requests_gpus(cluster: ClusterConfig) -> bool:
    """Whether the ranks compute on GPUs the jobs ask SLURM for: ``cluster.device=cuda``; cpu or auto: CPU nodes."""
    return cluster.device == "cuda"


def node_of_ranks(topo: Topology) -> list[int]:
    """Node index (0-based, in the allocation's node order) of every rank of `topo` (placed by
    :func:`~ralp_pipe.contract.topology.placement`): its host."""
    return list(topo.hosts)


def gpus_per_node_used(topo: Topology, gpus_per_node: int) -> list[int]:
    """GPUs the ranks of `topo` use on each of its nodes (:func:`~ralp_pipe.contract.topology.gpu_slots`), in
    node order."""
    slots = gpu_slots(topo, gpus_per_node)
    used: dict[int, set[int]] = {}
    for rank, slot in enumerate(slots):
        used.setdefault(topo.hosts[rank], set()).add(slot)
    return [len(used.get(node, ())) for node in range(max(topo.hosts) + 1)]


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
