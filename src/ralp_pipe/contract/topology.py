"""Which rank does what for each strategy: workers first (ranks 0..W-1), then PS ranks.

The counts come from the strategy table (:mod:`ralp_pipe.config.strategies`); the built-in ones:

| strategy    | workers | PS ranks              | world size    |
|-------------|---------|-----------------------|---------------|
| `ps`        | N       | `num_ps` PS processes | N + num_ps    |
| `allreduce` | N       | none                  | N             |
| `ralp_h`    | ⌈N / 2⌉ | 1 PS device           | ⌈N / 2⌉ + 1   |
| `ralp_n`    | N - 1   | 1 PS device           | N             |
| `dtf`       | N       | N PS tasks (one/host) | 2N            |
| `byteps`    | N       | N PS ranks (one/host) | 2N            |

RALP-H's half of the devices rounds up: at odd N (N=3: 2 workers + the PS device) it uses every
device rather than leaving one idle, as RALP-N does; at even N, the paper's, the two readings agree.

A "ps" rank only holds parameters and applies SGD; a "ps_device" rank (RALP) also runs the
upper layers of the model on the global batch.

Hosts (:attr:`Topology.hosts`): every rank is a host of its own, except `ps`, `dtf` and `byteps` PS ranks placed
``colocated`` (``strategy.ps_placement``), the usual Distributed-TensorFlow deployment of one
worker task and one PS task per machine: PS rank i then shares worker i's host and link
(PS ranks beyond the worker count wrap around). RALP's PS device is a device of its own, and
`allreduce` has no PS, so the placement changes nothing for them.

Hosts of G GPUs (:func:`on_hosts`, ``cluster.gpus_per_node`` G > 1, the emulated cluster's hosts): the
GPU ranks (workers, RALP's PS device) fill hosts G at a time in rank order, so an all-reduce ring leaves
each host once as NCCL's does; RALP's PS device has a host of its own after the workers' hosts, or
(``ps_device_shares_host``, where the plan priced it faster) the first slot of host 0 beside workers
0..G-2, the placement the cost model prices (:class:`ralp_pipe.planning.costmodel.Pricing`). PS ranks,
which hold no GPU, are colocated on worker host i mod H or get hosts of their own after them. A strategy with
one PS per worker host (``ps_per_host``: `dtf`, `byteps`) keeps one per worker host, as the planner prices it:
its PS ranks beyond the H worker hosts are dropped (the strategy table gives it one per GPU, one per host at
G = 1).

One placement (:func:`placement`): :func:`on_hosts` is the only function that decides which rank goes on which
host, and :func:`gpu_slots` which GPU of its host each rank computes on. The planner prices it, simulate prices
it, the emulator makes its hosts, and under SLURM its hosts are the job's nodes (:mod:`ralp_pipe.runtime.nodes`
reads them for ``srun``'s host file and the job's resources), RALP's PS device where the plan put it
(``ps_device_host``) on every launcher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from ralp_pipe.config import PS_PLACEMENTS, REFERENCE, STRATEGY_KINDS, Config, cluster_kind, strategy_kind
from ralp_pipe.config.schema import StrategyConfig
from ralp_pipe.config.strategies import RING, STAR

WORKER, PS, PS_DEVICE = "worker", "ps", "ps_device"
# the traffic a run's links carry (link_pattern): every link at once, as an all-reduce ring; workers pushing to and
# pulling from one server host
LINK_PATTERNS = (RING, STAR)
# where RALP's PS device is on hosts of several GPUs (plans' ps_device_host), by whether it shares a worker host
PS_DEVICE_HOSTS = {False: "a host of its own", True: "a worker host"}


@dataclass(frozen=True)
class Topology:
    """The ranks of one training run and the role of each."""

    strategy: str
    gpus: int
    workers: list[int]
    ps: list[int]
    roles: list[str]
    hosts: list[int]

    @property
    def world_size(self) -> int:
        """Number of processes (ranks) the run starts."""
        return len(self.roles)

    @property
    def num_workers(self) -> int:
        """Number of data-parallel workers (each processes `batch_size` images per step)."""
        return len(self.workers)

    @property
    def num_hosts(self) -> int:
        """Number of hosts (machines, nodes, emulated hosts) the ranks occupy."""
        return len(set(self.hosts))

    def ranks_on(self, host: int) -> list[int]:
        """Ranks placed on `host`."""
        return [rank for rank, h in enumerate(self.hosts) if h == host]

    def role(self, rank: int) -> str:
        """Role ("worker", "ps" or "ps_device") of `rank`."""
        return self.roles[rank]


def topology(strategy: str, gpus: int, num_ps: int = 1, ps_placement: str = "dedicated") -> Topology:
    """Ranks, roles and hosts of `strategy` given `gpus` devices and, for `ps`, `num_ps` PS processes."""
    kind = strategy_kind(strategy)
    if ps_placement not in PS_PLACEMENTS:
        raise ValueError(f"unknown ps_placement {ps_placement!r}; choose one of: {', '.join(PS_PLACEMENTS)}")
    if gpus < 1:
        raise ValueError(f"gpus={gpus} must be at least 1")
    if gpus < kind.min_gpus:
        raise ValueError(f"gpus={gpus} is too few for {strategy}: it needs at least {kind.min_gpus} ({kind.ranks})")
    if kind.has_ps and num_ps < 1:
        raise ValueError(f"num_ps={num_ps} must be at least 1 for the {strategy} strategy")
    n_workers = kind.workers(gpus)
    server_roles = [PS if kind.has_ps else PS_DEVICE] * kind.servers(gpus, num_ps)
    roles = [WORKER] * n_workers + server_roles
    colocated = kind.has_ps and ps_placement == "colocated"
    hosts = [
        rank if rank < n_workers or not colocated else (rank - n_workers) % n_workers for rank in range(len(roles))
    ]
    return Topology(
        strategy=strategy,
        gpus=gpus,
        workers=list(range(n_workers)),
        ps=list(range(n_workers, len(roles))),
        roles=roles,
        hosts=hosts,
    )


def of_strategy(strategy: StrategyConfig, gpus: int) -> Topology:
    """:func:`topology` of a composed ``strategy`` config group with `gpus` devices."""
    return topology(strategy.name, gpus, strategy.num_ps, strategy.ps_placement)


def on_hosts(topo: Topology, gpus_per_node: int, ps_device_shares_host: bool = False) -> Topology:
    """`topo` with its ranks on hosts of `gpus_per_node` GPUs (see the module doc); unchanged at one GPU per host."""
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node={gpus_per_node} must be at least 1")
    if gpus_per_node == 1:
        return topo
    shares = ps_device_shares_host and PS_DEVICE in topo.roles
    first = 1 if shares else 0  # the slot of worker 0: after the PS device where it shares host 0
    worker_hosts = -(-(topo.num_workers + first) // gpus_per_node)
    if strategy_kind(topo.strategy).ps_per_host:  # one PS task per worker host
        kept = topo.num_workers + min(len(topo.ps), worker_hosts)
        topo = replace(topo, ps=topo.ps[: kept - topo.num_workers], roles=topo.roles[:kept], hosts=topo.hosts[:kept])
    hosts = [(first + w) // gpus_per_node for w in topo.workers]
    extra = worker_hosts
    for index, rank in enumerate(topo.ps):
        if topo.roles[rank] == PS_DEVICE and shares:
            hosts.append(0)
        elif topo.hosts[rank] < topo.num_workers:  # a PS rank colocated on a worker's host: on a worker host
            hosts.append(index % worker_hosts)
        else:
            hosts.append(extra)
            extra += 1
    return replace(topo, hosts=hosts)


def placement(cfg: Config, ps_device_host: str | None = None) -> Topology:
    """The ranks of the run configured as `cfg` on hosts of ``cluster.gpus_per_node`` GPUs (:func:`on_hosts`), RALP's
    PS device on a worker host where `ps_device_host` (the plan's ``ps_device_host``, :data:`PS_DEVICE_HOSTS`) says
    so, else on a host of its own: where every launcher puts them (SLURM's nodes included) and what the plan priced."""
    if ps_device_host is not None and ps_device_host not in PS_DEVICE_HOSTS.values():
        raise ValueError(f"ps_device_host={ps_device_host!r}; one of: {', '.join(PS_DEVICE_HOSTS.values())}")
    topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
    return on_hosts(topo, cfg.cluster.gpus_per_node, ps_device_host == PS_DEVICE_HOSTS[True])


def gpu_slots(topo: Topology, gpus_per_node: int) -> list[int]:
    """Which GPU (0..`gpus_per_node`-1) of its host every rank of `topo` (as :func:`on_hosts` placed it) computes on.

    On each host RALP's PS device takes the first GPU, then the workers in rank order, then PS ranks the GPUs left
    (a dedicated PS rank, alone on its host, takes GPU 0). PS ranks beyond a host's GPUs (beside a full set of
    workers: the planner prices a PS as holding no GPU) share them in turn; a CUDA run whose ranks share a GPU
    talks over gloo (:func:`ralp_pipe.runtime.devices.resolve_backend`), since NCCL refuses two ranks on one."""
    order = sorted(range(topo.world_size), key=lambda r: (topo.roles[r] != PS_DEVICE, topo.roles[r] == PS, r))
    used: dict[int, int] = {}
    slots = [0] * topo.world_size
    for rank in order:
        host = topo.hosts[rank]
        slots[rank] = used.get(host, 0) % gpus_per_node
        used[host] = used.get(host, 0) + 1
    return slots


def placed(topo: Topology, hosts: Sequence[int]) -> Topology:
    """`topo` with rank r on ``hosts[r]``, as a driver laid its ranks out (:func:`on_hosts`) and tells them: the
    ranks beyond ``len(hosts)`` (PS tasks :func:`on_hosts` dropped) dropped."""
    kept = len(hosts)
    if not topo.num_workers <= kept <= topo.world_size:
        raise ValueError(f"{kept} hosts for {topo.strategy}'s {topo.world_size} ranks of {topo.num_workers} workers")
    return replace(topo, ps=topo.ps[: kept - topo.num_workers], roles=topo.roles[:kept], hosts=list(hosts))


def link_pattern(topo: Topology) -> str | None:
    """The traffic `topo`'s links carry, as the link check loads them; None where its ranks share one host.

    :data:`STAR` where its strategy's workers push to and pull from servers (``StrategyKind.link_pattern``) that
    sit on one host: that host's link carries every worker's traffic, the workers' links 1/W of it each. Servers
    on several hosts (``num_ps`` > 1 dedicated, one per host colocated, `dtf`'s task per host) load those hubs and
    every worker link at once, and an all-reduce loads every link: :data:`RING` (every link at once)."""
    if topo.num_hosts < 2:
        return None
    if strategy_kind(topo.strategy).link_pattern == STAR and len({topo.hosts[rank] for rank in topo.ps}) == 1:
        return STAR
    return RING


def links_of(cfg: Config) -> tuple[int, str | None]:
    """The hosts of the run configured as `cfg` and the pattern its links carry (what a link check is made for);
    on hosts of ``cluster.gpus_per_node`` GPUs, RALP's PS device on a host of its own (the most links)."""
    topo = placement(cfg)
    return topo.num_hosts, link_pattern(topo)


def largest_world(gpus: int, num_ps: int = 1, strategies: Iterable[str] | None = None) -> int:
    """Ranks of the largest run any of `strategies` (default: every strategy) makes at `gpus` (with `num_ps`
    servers): what a profile stands for."""
    names = STRATEGY_KINDS if strategies is None else strategies
    return max(topology(s, gpus, num_ps).world_size for s in names if gpus >= strategy_kind(s).min_gpus)


def cpu_share(cfg: Config, strategy: str, gpus: int) -> int | None:
    """The ranks by which a rank of `strategy` at `gpus` divides this host's CPUs (``train.cpu_share``).

    As configured; else, for the single-device reference (`allreduce` at N=1) on a cluster whose
    ranks share this host's CPUs, one rank of the experiment's largest run, which is what the
    profile times, so N x its throughput is what N such ranks would do with no communication;
    else None (the run's own ranks on the host).
    """
    if cfg.train.cpu_share is not None:
        return cfg.train.cpu_share
    if (strategy, gpus) == REFERENCE and cluster_kind(cfg.cluster.kind).shares_host_cpus:
        return largest_world(max(cfg.experiment.gpus), cfg.strategy.num_ps, cfg.experiment.strategies)
    return None


def assign_to_ps(sizes: list[int], num_ps: int) -> list[int]:
    """PS index (0..num_ps-1) of each tensor: greedy, largest tensor first onto the least-loaded PS."""
    loads = [0] * num_ps
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(num_ps), key=lambda p: (loads[p], p))
        owner[index] = target
        loads[target] += sizes[index]
    return owner


@dataclass(frozen=True)
class Hosts:
    """G GPUs per host behind the host's one network link, talking to each other at the interconnect's rate."""

    gpus_per_node: int = 1
    interconnect_bytes_per_s: float = math.inf  # per GPU, each direction

    def count(self, gpus: int) -> int:
        """Hosts `gpus` GPUs fill, G at a time."""
        return -(-gpus // self.gpus_per_node)

    def in_host_s(self, param_bytes: float, summed: bool) -> float:
        """Seconds a GPU's interconnect takes for one direction of its gradients' way out of the host: a ring
        reduce inside it moves (G-1)/G of them per GPU (`summed`), else every GPU sends its whole set."""
        if self.gpus_per_node == 1:
            return 0.0
        share = (self.gpus_per_node - 1) / self.gpus_per_node if summed else 1.0
        return share * param_bytes / self.interconnect_bytes_per_s


def hosts_of(cfg: Config) -> Hosts:
    """The GPUs per host of `cfg` (``cluster.gpus_per_node``) and the interconnect between them."""
    rate = cfg.interconnect.gbytes_per_s
    return Hosts(cfg.cluster.gpus_per_node, math.inf if rate is None else rate * 1e9)
