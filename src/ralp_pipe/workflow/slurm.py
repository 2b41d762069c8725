"""What each workflow job asks SLURM for, in snakemake-executor-plugin-slurm's resource names.

Computed once per job from its stage's resolved config (``cluster.slurm.*``) and refused while
the workflow parses when a node or the partition cannot hold it, naming the numbers.

| stage | nodes | tasks | per node | limit |
|---|---|---|---|---|
| ``train`` | the hosts of the run's placement (:func:`~ralp_pipe.contract.topology.placement`, read by :func:`~ralp_pipe.runtime.nodes.node_of_ranks`) | one per rank (``mpi``: the launcher runs ``srun``) | ``gres=gpu:G`` where ``cluster.device=cuda`` (G: the GPUs the fullest node's ranks use, at most ``cluster.gpus_per_node``), ``mem_mb`` x ranks | ``init_timeout_s + timeout_s`` + ``margin_min`` |
| ``probe`` (link) | 2 (1 where every training run fits on one) | 2 | ``mem_mb``, ``cpus_per_task`` | ``time_min`` |
| ``profile`` | 1 | 1 | ``cpus_per_task`` CPUs and ``gres=gpu:1`` where ``cluster.device=cuda``: the compute of one rank | ``time_min`` |
| ``concurrent`` | 1 | 1 | every rank of the workload's jobs at once: ``cpus_per_task`` and ``mem_mb`` x those ranks | experiment.repeats x (each job's bound alone, then the longest again for the run together), + ``margin_min`` |
| ``train`` on emulated hosts (``cluster=emulated``) | 1 | 1 (the run starts its ranks in namespaces on the node) | every rank at once: ``cpus_per_task`` and ``mem_mb`` x ranks (CPUs at most ``cpus_per_node``) | as ``train`` |
| ``check_links``; ``probe`` on emulated hosts | 1 | 1 | as an emulated ``train`` job, one rank per host checked (the probe: 2) | ``time_min`` |
| ``prepare_shards``, ``plan`` | 1 | 1 | ``mem_mb`` (CPUs: the rule's threads, ``dataset.shards.workers`` or 1) | ``time_min`` |

A node is a host of the plan's placement: ``cluster.gpus_per_node`` is the GPUs of one node, and the ranks the plan
puts on a host share that node's link, as it priced them. The job is sized before its plan exists, so RALP's PS
device counts as on a node of its own (the most nodes); where the plan puts it beside workers instead, the job
leaves its last node idle. Jobs ask for GPUs where ``cluster.device=cuda`` (:func:`~ralp_pipe.runtime.nodes.requests_gpus`);
``cpu`` and ``auto`` run on CPU nodes.

Emulated hosts (``cluster.kind=emulated``: a training run, a link check, a concurrent workload) are network
namespaces the job makes on its one node, as a local run makes them here (as root, or inside an unprivileged user
namespace where the node allows them), so an emulated matrix spreads over the cluster one job per node. Its ranks
share that node's CPUs, as they share this machine's in a local run: the job asks for one CPU per rank
(``cpus_per_task`` each), at most the node's ``cpus_per_node`` where that is set.

The rules of training, profile, probe, link-check and concurrent jobs pass ``cpus_per_task``: else the plugin would
ask for their threads, every core of the submit host. Measurement jobs (:data:`MEASUREMENTS`) add ``--exclusive`` through
``slurm_extra`` when ``cluster.slurm.exclusive`` is set, so nothing else shares their nodes.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from ralp_pipe.config import Config, cluster_kind
from ralp_pipe.contract.topology import links_of, of_strategy, placement
from ralp_pipe.errors import ConfigError
from ralp_pipe.runtime.nodes import gpus_per_node_used, node_of_ranks, requests_gpus

MEASUREMENTS = ("train", "profile", "probe", "check_links", "concurrent")  # jobs whose timings must not share a node
PROBE_NODES = 2  # the link probe's two ranks, one per node, so its bytes cross the fabric


def training_seconds(cfg: Config) -> float:
    """A training run's own bound: rank start plus the run."""
    return cfg.cluster.init_timeout_s + cfg.cluster.timeout_s


def training_minutes(cfg: Config) -> int:
    """SLURM time limit of a training job: its own bound plus the margin, in whole minutes."""
    return math.ceil(training_seconds(cfg) / 60) + cfg.cluster.slurm.margin_min


def ranks_per_node(cfg: Config) -> list[int]:
    """Ranks of the training run of `cfg` on each node of its allocation, in node order (its :func:`placement`,
    RALP's PS device on a node of its own)."""
    topo = placement(cfg)
    counts = Counter(node_of_ranks(topo))
    return [counts[node] for node in range(len(counts))]


def _placement(cfg: Config) -> dict[str, str]:
    """Where every job goes: its partition and the account it is charged to, where set."""
    s = cfg.cluster.slurm
    named = {"slurm_partition": s.partition, "slurm_account": s.account}
    return {name: value for name, value in named.items() if value}


def job_resources(cfg: Config, stage: str, probe_nodes: int = PROBE_NODES) -> dict[str, Any]:
    """The resources a job of `stage` passes to the SLURM executor plugin (see the module docstring);
    a link probe spans `probe_nodes` nodes (at most two: one where every training run fits on one)."""
    s = cfg.cluster.slurm
    gpus = requests_gpus(cfg.cluster)
    resources: dict[str, Any] = {"mem_mb": s.mem_mb, "runtime": s.time_min, "cpus_per_task": s.cpus_per_task}
    resources.update(_placement(cfg))
    extra = ["--exclusive"] if s.exclusive and stage in MEASUREMENTS else []
    emulated = cluster_kind(cfg.cluster.kind).launcher == "emulated"
    if stage == "train" and emulated:
        ranks = of_strategy(cfg.strategy, cfg.cluster.gpus).world_size
        resources.update(one_node(cfg, f"training {cfg.strategy.name} at N={cfg.cluster.gpus} (emulated)", ranks))
        resources.update(tasks_per_gpu=0, runtime=training_minutes(cfg))
    elif stage == "check_links":
        hosts = links_of(cfg)[0]
        resources.update(one_node(cfg, f"the link check of {hosts} emulated hosts", hosts))
    elif stage == "probe" and emulated:  # its two ranks on emulated hosts of the node
        resources.update(one_node(cfg, f"the link probe of network {cfg.network.name} (emulated)", PROBE_NODES))
    elif stage == "train":
        per_node = ranks_per_node(cfg)
        fullest = max(per_node)
        resources.update(
            nodes=len(per_node),
            tasks=sum(per_node),
            mpi="srun",  # the launcher starts the ranks with srun inside the allocation
            tasks_per_gpu=0,  # else the plugin would add --ntasks-per-gpu=<tasks>
            mem_mb=fullest * s.mem_mb,  # --mem is per node
            runtime=training_minutes(cfg),
        )
        if gpus:
            resources["gres"] = f"gpu:{max(gpus_per_node_used(placement(cfg), cfg.cluster.gpus_per_node))}"
        extra.append(f"--ntasks-per-node={fullest}")
        check_fits(cfg, f"training {cfg.strategy.name} at N={cfg.cluster.gpus}", len(per_node), fullest)
    elif stage == "profile" and gpus:
        resources["gres"] = "gpu:1"  # the device one rank computes on
    elif stage == "probe":
        nodes = min(probe_nodes, PROBE_NODES)
        fullest = PROBE_NODES // nodes
        resources.update(nodes=nodes, tasks=PROBE_NODES, mpi="srun", mem_mb=fullest * s.mem_mb)
        extra.append(f"--ntasks-per-node={fullest}")
        check_fits(cfg, f"the link probe of network {cfg.network.name}", nodes, fullest)
    if extra:
        resources["slurm_extra"] = " ".join(extra)
    return resources


def check_fits(cfg: Config, job: str, nodes: int, fullest: int, shares_cpus: bool = False) -> None:
    """Refuse `job` of `nodes` nodes with `fullest` ranks on one where the configured nodes cannot hold it
    (`shares_cpus`: its ranks share the node's CPUs, so only their memory must fit)."""
    s = cfg.cluster.slurm
    what = f"{job} ({nodes} node(s), up to {fullest} rank(s) on one)"
    if s.max_nodes is not None and nodes > s.max_nodes:
        raise ConfigError(
            f"{what} needs {nodes} nodes but cluster.slurm.max_nodes={s.max_nodes}: lower experiment.gpus, "
            f"raise cluster.gpus_per_node or use strategy.ps_placement=colocated"
        )
    limits = (
        ("cpus_per_task", s.cpus_per_task, "cpus_per_node", s.cpus_per_node, "CPUs"),
        ("mem_mb", s.mem_mb, "mem_mb_per_node", s.mem_mb_per_node, "MB"),
    )
    for key, each, node_key, node_has, unit in limits[shares_cpus:]:
        if node_has is not None and fullest * each > node_has:
            raise ConfigError(
                f"{what} asks one node for {fullest} x cluster.slurm.{key}={each} = {fullest * each} {unit} "
                f"but cluster.slurm.{node_key}={node_has}"
            )


def one_node(cfg: Config, job: str, ranks: int) -> dict[str, Any]:
    """Nodes, tasks, CPUs and memory of `job`, whose `ranks` run on emulated hosts inside one node: one task, one
    CPU (``cpus_per_task``) per rank, at most the node's ``cpus_per_node`` (the ranks share it, as they share this
    machine's in a local run), and ``mem_mb`` per rank; refused where the node cannot hold the memory."""
    s = cfg.cluster.slurm
    cpus = ranks * s.cpus_per_task
    if s.cpus_per_node is not None:
        cpus = min(cpus, s.cpus_per_node)
    check_fits(cfg, job, 1, ranks, shares_cpus=True)
    return {"nodes": 1, "tasks": 1, "cpus_per_task": cpus, "mem_mb": ranks * s.mem_mb}


def concurrent_resources(
    cfg: Config, workloads: Sequence[Sequence[Config]], overrides: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """The resources of the job running the concurrent `workloads` of the experiment `cfg` (``cluster.slurm.*``; each
    workload's jobs' configs, and the `overrides` that tell which jobs are alike): one node for the ranks of the
    largest workload at once (:func:`one_node`), for each distinct job alone and then each workload together."""
    s = cfg.cluster.slurm
    ranks = [sum(of_strategy(job.strategy, job.cluster.gpus).world_size for job in jobs) for jobs in workloads]
    largest = max(range(len(workloads)), key=lambda w: ranks[w])
    what = f"a concurrent workload of {len(workloads[largest])} jobs"
    resources: dict[str, Any] = one_node(cfg, what, ranks[largest])
    alone = {
        job: training_seconds(config) for jobs, texts in zip(workloads, overrides) for config, job in zip(jobs, texts)
    }
    together = [max(training_seconds(job) for job in jobs) for jobs in workloads]
    # each of experiment.repeats rounds: every distinct job alone, then each workload's longest again all together
    resources["runtime"] = math.ceil(cfg.experiment.repeats * (sum(alone.values()) + sum(together)) / 60) + s.margin_min
    resources.update(_placement(cfg))
    if s.exclusive:
        resources["slurm_extra"] = "--exclusive"
    return resources
