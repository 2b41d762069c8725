"""The explicit cost model shared by `plan` and `simulate`: one synchronous step, phase by phase.

Inputs: a profile (per-unit forward/backward seconds at measured batches, seconds per
parameter byte of gradient aggregation and of the SGD update), the bytes each category moves
per step (exactly :func:`ralp_pipe.engine.volume.step_bytes`), and a link (bytes/s and latency per
message) that every host has, full duplex.

Phases of one step:

- `ps`, sequential (``strategy.overlap=false``): workers zero their flat gradient buffer and
  run forward+backward of every unit at batch b; all W workers push the gradients over the PS
  links (fan-in: the PS links carry the sum, split over `num_ps` servers); each PS adds the W
  gradient sets in place, averages them and applies SGD; the workers pull the parameters
  straight into the model (fan-out, again the sum over the PS links).
- `ps`, pipelined (:class:`Pipelining`, the default): buckets are pushed while backward runs
  and pulled while later buckets are still pushed, both directions of the full-duplex PS link
  busy at once, and each PS reduces and updates a bucket as it completes. The PS side is then
  bound by the slower of one direction of its link (W x model bytes / num_ps) and its own
  reduce+update; backward hides as much of that as it lasts; the last bucket's pull to every
  worker is the tail no push can hide (the next forward needs the first layers, which backward
  produces last).
- PS placement (``strategy.ps_placement``): dedicated PS ranks are hosts of their own, so the
  busiest link is a PS link carrying W x model bytes / num_ps each direction (or a worker's,
  one model each direction, when num_ps > W); colocated PS rank i shares worker i's host, whose
  link then carries, each direction, its worker's traffic to the other PSes plus its PS's
  traffic with the other W-1 workers (:func:`ps_direction_bytes`).
- `allreduce`: workers run forward+backward; a ring all-reduce sends 2(N-1)/N x gradients
  over each worker's link in 2(N-1) latency-bound steps at the measured all-reduce bus
  bandwidth (at most the link's), adding (N-1)/N of a gradient set; each worker applies SGD
  to all parameters. As DDP does (:attr:`Pricing.ddp_overlap`), the gradients are all-reduced
  in buckets (the first of 1 MiB, then 25 MiB, filled in backward's order: the last units'
  parameters first), one bucket at a time, each as soon as backward has produced all of its
  gradients (a unit's at the end of its backward): backward hides what ends before it does,
  and the step ends when the last bucket's ring has ended and SGD is done. Without the
  overlap (one host's loopback, whose transfers are copies by the computing cores) the ring
  follows backward.
- `ralp_h` / `ralp_n`: workers run the lower units forward at batch b; activations (and
  labels) go up the PS device's link; the PS device runs the upper units forward+backward at
  batch W*b; activation gradients come down while it applies SGD to the upper units; workers
  run the lower units backward; lower gradients go up; the PS device sums them and applies
  SGD; lower parameters come down. Every one of those transfers crosses the single PS device
  link, each direction at its own rate (full duplex): sequentially every transfer waits for
  the one before, so the step pays all of the bytes in series; pipelined
  (:class:`Pipelining`), the lower part's push and pull run as pipelined `ps` does (the PS
  device as one PS of the lower parameters: push and pull in the two directions at once,
  hidden by the workers' lower backward as far as it lasts, the last bucket's pull the tail),
  after the activations' way up and their gradients' way down, which the PS device's
  computation separates. The PS device serves the lower part once it has updated the upper
  one: what of that update outlasts the activation gradients' way down delays its reduces and
  pulls (not the pushes, which it receives meanwhile), and the workers' backward hides that
  delay as far as it lasts; what it does not hide is the PS device's (server) time.

Hosts of several GPUs (:class:`~ralp_pipe.contract.topology.Hosts`, ``cluster.gpus_per_node`` G > 1; at G = 1 every price above is
unchanged): traffic between the GPUs of one host runs at the interconnect's rate, traffic between hosts
through each host's one link, which its GPUs' flows share.

- `allreduce` as NCCL's ring runs it: one ring through all N GPUs, entering and leaving each host once
  per channel (NCCL orders the ring so that a host's GPUs are neighbours), so every GPU's interconnect
  and every host's link carry the same 2(N-1)/N of the gradients each direction, as on one GPU per
  host; the ring runs at its slowest hop (the host link, or the interconnect where one host holds them all).
- `ps` as BytePS runs it: a host's G GPUs sum their gradients over the interconnect, the host pushes the
  sum once and pulls once (one worker per host on the PS links, one PS per host where colocated),
  tensors partitioned over the servers; the busiest direction is the slower of the host link's and
  the interconnect's part, the two stages pipelined by bucket.
- `dtf` (Distributed TensorFlow): each variable whole on one PS task (:class:`WholeVariables`: round-robin
  in creation order as ``replica_device_setter`` placed them, or greedily onto the least-loaded task), so
  the busiest PS task holds more than 1/num_ps; a host's GPUs summed before the push
  (``distributed_replicated``) or every GPU pushing (``parameter_server``); its transport (gRPC) costing each
  byte the link's time plus its own (``transport_cap``: 1 / (1/rate + 1/cap)); its PS tasks' CPU applying each
  pushed gradient separately, per byte, and paying per tensor sent or received (``apply_s_per_byte``, ``rpc_s``,
  measured on TensorFlow's own PS tasks; unset: the profile's reduce and SGD step). Pipelined, each variable travels
  whole and returns only once every pusher's copy has arrived (with ``step_barrier``, TensorFlow's, only once
  every variable of every task is updated), so one large variable decides when the step ends; no bucket formula
  prices that, and the step is run as a timeline of every variable's push, reduce, update and pull over the
  shared host links (:mod:`ralp_pipe.planning.timeline`), as the engine runs it, at any G.
- RALP: the PS device is a GPU of a host of its own, or one GPU of a worker host whose other G-1 GPUs
  are workers (:attr:`Pricing.ps_device_shares_host`); the busiest link then carries the remote
  workers' share of the traffic and the interconnect the local workers' share. The planner prices both
  and keeps the faster.

Gradient aggregation and SGD are priced per parameter byte as the profile timed them on the
servers' own code (:class:`ralp_pipe.engine.strategies.base.FlatSgd`).

Where all ranks share one CPU machine (:class:`SharedCpu`), a compute phase takes the profiled
time x profile threads / the cores a rank gets: its own threads, or fewer when more ranks
compute at once than there are cores.
Unit times at batches that were not profiled are interpolated linearly between measured
batches and scaled proportionally beyond them (:func:`ralp_pipe.contract.records.at_batch`, which the
time-dilated emulation of a profile file shares).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, cast

from ralp_pipe.config import strategy_kind
from ralp_pipe.config.units import in_series, payload_bytes_per_s
from ralp_pipe.contract.records import at_batch, unit_curve
from ralp_pipe.contract.topology import (  # where RALP's PS device is, by Pricing.ps_device_shares_host
    PS_DEVICE_HOSTS,
    Hosts,
)
from ralp_pipe.contract.unit_table import check_split, variable_owners
from ralp_pipe.planning.timeline import DtfStep, dtf_period

# DDP's gradient buckets: the first (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), then bucket_cap_mb's default
DDP_FIRST_BUCKET_BYTES = 2**20
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class UnitCost:
    """Measured forward/backward seconds of one placement unit at the profiled batches."""

    name: str
    param_bytes: int
    batches: tuple[int, ...]
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]

    def fwd(self, batch: int) -> float:
        """Forward seconds at `batch`."""
        return at_batch(self.batches, self.fwd_s, batch)

    def bwd(self, batch: int) -> float:
        """Backward seconds at `batch`."""
        return at_batch(self.batches, self.bwd_s, batch)


@dataclass(frozen=True)
class ComputeCosts:
    """What the cost model needs from a profile: unit costs and per-byte update costs."""

    units: tuple[UnitCost, ...]
    update_s_per_byte: float
    aggregate_s_per_byte: float

    @property
    def param_bytes(self) -> int:
        """Bytes of all trainable parameters."""
        return sum(u.param_bytes for u in self.units)

    def fwd(self, units: slice, batch: int) -> float:
        """Forward seconds of `units` at `batch`."""
        return sum(u.fwd(batch) for u in self.units[units])

    def bwd(self, units: slice, batch: int) -> float:
        """Backward seconds of `units` at `batch`."""
        return sum(u.bwd(batch) for u in self.units[units])


def compute_costs(profile: Mapping[str, Any]) -> ComputeCosts:
    """The :class:`ComputeCosts` of a profile document written by `ralp-pipe profile`."""
    units = []
    for row in profile["units"]:
        batches, fwd_s, bwd_s = unit_curve(row)
        units.append(UnitCost(row["name"], int(row["param_bytes"]), batches, fwd_s, bwd_s))
    update = profile["update"]
    return ComputeCosts(tuple(units), float(update["update_s_per_byte"]), float(update["aggregate_s_per_byte"]))


@dataclass(frozen=True)
class Link:
    """One host's network link: payload bytes/s each direction and seconds per message.

    `allreduce_bytes_per_s` is the bus bandwidth of the training backend's all-reduce where it
    was measured (it also pays for the reduction and the backend's copies); None: the link's.
    """

    bytes_per_s: float
    latency_s: float = 0.0
    source: str = ""
    allreduce_bytes_per_s: float | None = None

    @property
    def ring_bytes_per_s(self) -> float:
        """Bytes/s a ring all-reduce moves per worker: the bus bandwidth, at most the link's."""
        return min(self.bytes_per_s, self.allreduce_bytes_per_s or self.bytes_per_s)


@dataclass
class Prediction:
    """Predicted step time and its phases for one strategy, N and split."""

    strategy: str
    gpus: int
    split: int | None
    images_per_step: int
    compute_s: float
    server_s: float
    comm_s: float
    bytes_per_step: dict[str, int] = field(default_factory=dict)
    ps_device_host: str | None = None  # RALP on hosts of several GPUs: where its PS device is (PS_DEVICE_HOSTS)

    @property
    def step_time_s(self) -> float:
        """Seconds of one synchronous step."""
        return self.compute_s + self.server_s + self.comm_s

    @property
    def images_per_sec(self) -> float:
        """Images processed by all workers per second."""
        return self.images_per_step / self.step_time_s

    @property
    def gb_per_step(self) -> dict[str, float]:
        """`bytes_per_step` in GB (10^9 bytes)."""
        return {k: v / 1e9 for k, v in self.bytes_per_step.items()}

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for plan tables and Parquet rows."""
        return {
            "split": self.split,
            "predicted_step_time_s": self.step_time_s,
            "predicted_images_per_sec": self.images_per_sec,
            "predicted_compute_s": self.compute_s,
            "predicted_server_s": self.server_s,
            "predicted_comm_s": self.comm_s,
            "predicted_bytes_per_step": dict(self.bytes_per_step),
            "predicted_gb_per_step": self.gb_per_step,
            **({"ps_device_host": self.ps_device_host} if self.ps_device_host else {}),
        }


@dataclass(frozen=True)
class Pipelining:
    """Pipelined parameter-server transfers (``strategy.overlap``) in buckets of `bucket_bytes`."""

    bucket_bytes: float


@dataclass(frozen=True)
class SharedCpu:
    """Ranks that all run on one CPU machine: its cores, the profile's threads, each rank's threads."""

    cores: int
    profile_threads: int
    share: int | None = None  # ranks the cores are divided by (train.cpu_share); None: the world

    def slowdown(self, concurrent: int, world_size: int) -> float:
        """Time factor against the profile for `concurrent` ranks computing at once."""
        per_rank = max(1, self.cores // (self.share or world_size))
        return self.profile_threads / min(per_rank, self.cores / concurrent)


@dataclass(frozen=True)
class WholeVariables:
    """`dtf`'s variables: their bytes in creation order, each whole on one PS task."""

    sizes: tuple[int, ...]
    units: tuple[int, ...] = ()  # each variable's placement unit (needed to price the pipelined step)
    greedy: bool = False  # onto the least-loaded task (GreedyLoadBalancingStrategy); False: round-robin
    sum_in_host: bool = True  # distributed_replicated: a host's GPUs summed before the push
    transport_cap: float | None = None  # payload bytes/s the transport moves alone, in series with the link
    step_barrier: bool = False  # pipelined: a PS task replies once every task's variables are updated (TF's barrier)
    apply_s_per_byte: float | None = None  # a PS task's CPU applying one pushed gradient; None: the profile's rates
    rpc_s: float = 0.0  # a PS task's CPU per tensor received or sent (gRPC's RecvTensor), apart from its bytes
    colocated: bool = True  # a PS task on every worker host (strategy.ps_placement); False: hosts of their own

    def loads(self, num_ps: int) -> list[int]:
        """Bytes each of `num_ps` PS tasks holds (the engine's assignment, :func:`variable_owners`)."""
        loads = [0] * num_ps
        for size, task in zip(self.sizes, variable_owners(self.sizes, num_ps, self.greedy)):
            loads[task] += size
        return loads


def whole_variable_direction_bytes(loads: Sequence[int], hosts: int, pushes_per_host: int, colocated: bool) -> float:
    """Bytes the busiest host link of a `dtf` step carries each direction: PS task p holding `loads[p]`, on
    host p mod `hosts` (`colocated`) or a host of its own, with `pushes_per_host` gradient sets leaving each
    worker host. A colocated host sends its pushes to the other hosts' tasks and serves the other hosts'
    pushes to its own; a dedicated task's link carries every host's pushes of its variables."""
    total = sum(loads)
    if not colocated:
        return float(max(hosts * pushes_per_host * max(loads), pushes_per_host * total))
    on_host = [0] * hosts
    for task, load in enumerate(loads):
        on_host[task % hosts] += load
    return float(max(pushes_per_host * ((total - held) + (hosts - 1) * held) for held in on_host))


def ps_direction_bytes(model_bytes: float, workers: int, num_ps: int, colocated: bool) -> float:
    """Bytes the busiest host link of a `ps` step carries in each direction (pushes in, pulls out).

    Each PS holds model/num_ps, as the engine's buckets spread it (balanced within one bucket;
    with ``bucket_mb=0`` whole parameters go to servers and a large one can unbalance them,
    which this does not price). Dedicated: a PS link moves W shards, a worker link one model.
    Colocated (m = ceil(num_ps / W) PS ranks on the busiest worker host, each with one local
    worker): model x (1 - m/num_ps) for its worker's non-local shards plus (W-1) x m shards for
    its PS ranks' remote workers.
    """
    if not colocated:
        return model_bytes * max(1.0, workers / num_ps)
    m = math.ceil(num_ps / workers)
    return model_bytes * ((1 - m / num_ps) + (workers - 1) * m / num_ps)


@dataclass(frozen=True)
class Pricing:
    """What the steps of one plan are priced with: the profile's unit costs at the per-worker batch, the link,
    the `ps` PS ranks and their placement, whether their transfers are pipelined, and the CPU ranks share."""

    costs: ComputeCosts
    batch_size: int
    link: Link
    num_ps: int = 1
    colocated: bool = False  # `ps` PS ranks on the workers' hosts (strategy.ps_placement)
    pipelining: Pipelining | None = None  # None: the sequential step (`ps` and RALP, see predict)
    shared: SharedCpu | None = None  # None: every rank has a device of its own
    # `allreduce`'s buckets reduced during backward (False: the ring after it, as on one host's loopback)
    ddp_overlap: bool = True
    hosts: Hosts = Hosts()  # GPUs per host and their interconnect (default: one GPU per host)
    variables: WholeVariables | None = None  # `dtf`'s variables (needed to price it)
    ps_device_shares_host: bool = False  # RALP's PS device on a worker host beside G-1 workers (G > 1)

    def slowdown(self, concurrent: int, world_size: int) -> float:
        """Time factor against the profile for `concurrent` of `world_size` ranks computing at once."""
        return 1.0 if self.shared is None else self.shared.slowdown(concurrent, world_size)


def predict(
    strategy: str, num_workers: int, gpus: int, volume: Mapping[str, int], pricing: Pricing, split: int | None = None
) -> Prediction:
    """Predicted step of `strategy` at `gpus` devices with `num_workers` workers moving `volume` bytes (see module doc).

    `pricing.pipelining` None is the sequential step of `ps` and RALP; `pricing.ddp_overlap` says whether
    `allreduce`'s buckets are reduced during backward.
    """
    kind = strategy_kind(strategy)
    if kind.places_layers:
        check_split(split, len(pricing.costs.units), f"the {strategy} prediction")
        compute, server, comm = _layer_placing_step(
            _ps_device_pricing(pricing, num_workers), num_workers, cast(int, split), volume
        )
    else:
        world = num_workers + kind.servers(gpus, pricing.num_ps)
        # forward+backward, then zeroing the flat gradients (ps) or two bucket copies (DDP; none on one worker,
        # which trains without DDP)
        passes = 1 if kind.has_ps else 2 if num_workers > 1 else 0
        compute = _full_model_compute(pricing, passes) * pricing.slowdown(num_workers, world)
        if kind.whole_variables:
            server, comm = _dtf_step(pricing, num_workers, world)
        elif kind.has_ps:
            server, comm = _ps_step(pricing, num_workers, world)
        else:
            server, comm = _allreduce_step(pricing, num_workers, world, volume["total"])
    where = (
        PS_DEVICE_HOSTS[pricing.ps_device_shares_host]
        if kind.places_layers and pricing.hosts.gpus_per_node > 1
        else None
    )
    return Prediction(
        strategy, gpus, split, num_workers * pricing.batch_size, compute, server, comm, dict(volume), where
    )


def _full_model_compute(pricing: Pricing, passes: int) -> float:
    """A worker's forward+backward of every unit and `passes` passes over its gradients, as profiled."""
    costs, b = pricing.costs, pricing.batch_size
    return (
        costs.fwd(slice(None), b) + costs.bwd(slice(None), b) + passes * costs.param_bytes * costs.aggregate_s_per_byte
    )


def _ps_step(pricing: Pricing, workers: int, world: int) -> tuple[float, float]:
    """(server, comm) seconds of a `ps` step: each PS adds the pushed gradient sets (one per host: its GPUs
    summed them) into the first, averages them and applies SGD to its 1/num_ps of the parameters; pushes and
    pulls cross the busiest host link, the sums inside a host its GPUs' interconnect."""
    costs, link, num_ps = pricing.costs, pricing.link, pricing.num_ps
    total_param, add = costs.param_bytes, costs.aggregate_s_per_byte
    pushers = pricing.hosts.count(workers)
    reduce_passes = pushers if pushers > 1 else 0
    server = (reduce_passes * add + costs.update_s_per_byte) * total_param / num_ps * pricing.slowdown(num_ps, world)
    direction_s = max(
        ps_direction_bytes(total_param, pushers, num_ps, pricing.colocated) / link.bytes_per_s,
        pricing.hosts.in_host_s(total_param, summed=True),
    )
    if pricing.pipelining is None:
        return server, 2 * direction_s + 2 * link.latency_s
    backward_s = costs.bwd(slice(None), pricing.batch_size) * pricing.slowdown(workers, world)
    shard_bytes = total_param / num_ps
    return _pipelined_ps(
        pricing, backward_s, server, direction_s, pushers - 1 if pricing.colocated else pushers, shard_bytes
    )


def _dtf_step(pricing: Pricing, workers: int, world: int) -> tuple[float, float]:
    """(server, comm) seconds of a `dtf` step at the transport's achieved rate. Sequential: every push crosses
    the busiest host link, the busiest PS task adds the pushed gradient sets of its whole variables and applies
    SGD to them, every pull crosses back. Pipelined: the step's timeline (:func:`_dtf_timeline`)."""
    variables = pricing.variables
    if variables is None:
        raise ValueError("pricing dtf needs its variables' sizes (Pricing.variables)")
    achieved = in_series(pricing.link.bytes_per_s, variables.transport_cap) or pricing.link.bytes_per_s
    link = dataclasses.replace(pricing.link, bytes_per_s=achieved)
    pricing = dataclasses.replace(pricing, link=link)
    costs, hosts = pricing.costs, pricing.hosts
    if pricing.pipelining is not None:
        period, server_s = dtf_period(_dtf_timeline(pricing, workers, world, variables))
        return server_s, period - _full_model_compute(pricing, 1) * pricing.slowdown(workers, world) - server_s
    per_host = 1 if variables.sum_in_host else hosts.gpus_per_node
    host_count = hosts.count(workers)
    pushers = host_count * per_host
    owners = variable_owners(variables.sizes, pricing.num_ps, variables.greedy)
    loads = variables.loads(pricing.num_ps)
    busiest = max(range(pricing.num_ps), key=loads.__getitem__)
    server = _dtf_server_s_per_byte(pricing, pushers, world) * loads[busiest] + _dtf_server_s_per_variable(
        pricing, pushers, world
    ) * sum(1 for size, task in zip(variables.sizes, owners) if size and task == busiest)
    network = whole_variable_direction_bytes(loads, host_count, per_host, pricing.colocated)
    direction_s = max(network / link.bytes_per_s, hosts.in_host_s(costs.param_bytes, variables.sum_in_host))
    return server, 2 * direction_s + 2 * link.latency_s


def _dtf_server_s_per_byte(pricing: Pricing, pushers: int, world: int) -> float:
    """A `dtf` PS task's seconds per byte of its variables: `pushers` applies on its CPU where measured
    (``WholeVariables.apply_s_per_byte``), else adding the gradient sets (none from one) and SGD, as profiled."""
    costs, apply = pricing.costs, pricing.variables.apply_s_per_byte if pricing.variables else None
    reduce_passes = pushers if pushers > 1 else 0
    per_byte = (
        pushers * apply if apply is not None else reduce_passes * costs.aggregate_s_per_byte + costs.update_s_per_byte
    )
    return per_byte * pricing.slowdown(pricing.num_ps, world)


def _dtf_server_s_per_variable(pricing: Pricing, pushers: int, world: int) -> float:
    """A `dtf` PS task's seconds per variable apart from its bytes: receiving `pushers` gradients and sending the
    variable back to each (``WholeVariables.rpc_s`` per tensor)."""
    rpc = pricing.variables.rpc_s if pricing.variables else 0.0
    return 2 * pushers * rpc * pricing.slowdown(pricing.num_ps, world)


def _dtf_timeline(pricing: Pricing, workers: int, world: int, variables: WholeVariables) -> DtfStep:
    """The pipelined `dtf` step of `pricing` (its link already at the transport's rate) as a variable-by-variable
    timeline: workers filling hosts G at a time, a host's GPUs summed before one push or each pushing its own."""
    if len(variables.units) != len(variables.sizes):
        raise ValueError("pricing a pipelined dtf step needs each variable's placement unit (WholeVariables.units)")
    costs, hosts, b = pricing.costs, pricing.hosts, pricing.batch_size
    slowdown = pricing.slowdown(workers, world)
    host_count, g = hosts.count(workers), hosts.gpus_per_node
    on_host = [min(g, workers - h * g) for h in range(host_count)]
    summed = variables.sum_in_host
    pushers = [1 if summed else n for n in on_host]
    return DtfStep(
        fwd_s=[u.fwd(b) * slowdown for u in costs.units],
        bwd_s=[u.bwd(b) * slowdown for u in costs.units],
        begin_s=costs.param_bytes * costs.aggregate_s_per_byte * slowdown,
        sizes=variables.sizes,
        units=variables.units,
        owners=variable_owners(variables.sizes, pricing.num_ps, variables.greedy),
        group_hosts=range(host_count),
        group_pushers=pushers,
        task_hosts=[p % host_count if pricing.colocated else host_count + p for p in range(pricing.num_ps)],
        sum_s_per_byte=[hosts.in_host_s(1.0, summed=True) if summed and n > 1 else 0.0 for n in on_host],
        server_s_per_byte=_dtf_server_s_per_byte(pricing, sum(pushers), world),
        server_s_per_variable=_dtf_server_s_per_variable(pricing, sum(pushers), world),
        link_bytes_per_s=pricing.link.bytes_per_s,
        latency_s=pricing.link.latency_s,
        port_bytes_per_s=hosts.interconnect_bytes_per_s if g > 1 else math.inf,
        barrier=variables.step_barrier,
    )


def _ring_hop(pricing: Pricing, workers: int) -> tuple[float, float]:
    """(bytes/s, seconds per message) of an all-reduce ring's slowest hop over `workers` GPUs: the host link
    where the ring leaves hosts (as it does at one GPU per host), else the interconnect."""
    link, hosts = pricing.link, pricing.hosts
    if hosts.gpus_per_node == 1:
        return link.ring_bytes_per_s, link.latency_s
    if hosts.count(workers) == 1:
        return hosts.interconnect_bytes_per_s, 0.0
    return min(link.ring_bytes_per_s, hosts.interconnect_bytes_per_s), link.latency_s


def _ps_device_pricing(pricing: Pricing, workers: int) -> Pricing:
    """`pricing` with a link whose rate prices RALP's transfers where hosts hold several GPUs: the busiest
    link carries the remote workers' share of the bytes (all of them where the PS device has a host of its
    own) and the PS device's interconnect the local workers' share, the two at once."""
    hosts = pricing.hosts
    if hosts.gpus_per_node == 1:
        return pricing
    local = min(hosts.gpus_per_node - 1, workers) if pricing.ps_device_shares_host else 0
    seconds_per_byte = max(
        (workers - local) / workers / pricing.link.bytes_per_s, local / workers / hosts.interconnect_bytes_per_s
    )
    return dataclasses.replace(pricing, link=dataclasses.replace(pricing.link, bytes_per_s=1 / seconds_per_byte))


def _allreduce_step(pricing: Pricing, workers: int, world: int, sent: int) -> tuple[float, float]:
    """(server, comm) seconds of a ring all-reduce step: (N-1)/N of an addition and SGD, and the ring: what
    of DDP's bucketed rings outlasts backward (:attr:`Pricing.ddp_overlap`), else the whole ring after it."""
    costs = pricing.costs
    add = costs.aggregate_s_per_byte
    server = ((workers - 1) / workers * add + costs.update_s_per_byte) * costs.param_bytes
    server *= pricing.slowdown(workers, world)
    if workers <= 1:
        return server, 0.0
    if pricing.ddp_overlap:
        return server, _ddp_exposed(pricing, workers, world, sent)
    rate, latency_s = _ring_hop(pricing, workers)
    return server, sent / workers / rate + 2 * (workers - 1) * latency_s


def _ddp_exposed(pricing: Pricing, workers: int, world: int, sent: int) -> float:
    """Seconds DDP's all-reduce runs on after backward has ended (with `workers` > 1).

    Gradients fill DDP's buckets in backward's order (the last unit's first), a unit's at the end of
    its backward; a bucket is all-reduced once its last gradient exists and the bucket before has been,
    its ring moving its share of the `sent` / `workers` bytes each worker sends, plus 2(N-1) latencies.
    """
    costs = pricing.costs
    rate, latency_s = _ring_hop(pricing, workers)
    total_param = costs.param_bytes
    slowdown = pricing.slowdown(workers, world)
    ready_at: list[tuple[float, float]] = []  # (parameter bytes produced, backward seconds when they were)
    produced, elapsed = 0.0, 0.0
    for unit in reversed(costs.units):
        produced += unit.param_bytes
        elapsed += unit.bwd(pricing.batch_size) * slowdown
        ready_at.append((produced, elapsed))
    seconds_per_byte = sent / workers / max(total_param, 1) / rate
    ring_latency = 2 * (workers - 1) * latency_s
    done, start, cap = 0.0, 0.0, float(DDP_FIRST_BUCKET_BYTES)
    while start < total_param:
        end = min(float(total_param), start + cap)
        ready = next(t for produced, t in ready_at if produced >= end)
        done = max(done, ready) + (end - start) * seconds_per_byte + ring_latency
        start, cap = end, float(DDP_BUCKET_BYTES)
    return max(0.0, done - elapsed)


def _layer_placing_step(
    pricing: Pricing, workers: int, split: int, volume: Mapping[str, int]
) -> tuple[float, float, float]:
    """(compute, server, comm) seconds of a RALP step split after unit `split`: the lower units on the
    workers, the upper ones on the PS device at the concatenated batch, every transfer over its link."""
    costs, b, link = pricing.costs, pricing.batch_size, pricing.link
    add, update = costs.aggregate_s_per_byte, costs.update_s_per_byte
    lower, upper = slice(0, split), slice(split, None)
    lower_param = sum(u.param_bytes for u in costs.units[lower])
    slowdown = pricing.slowdown(workers, workers + 1)
    backward_s = costs.bwd(lower, b) * slowdown
    compute = (costs.fwd(lower, b) + costs.bwd(lower, b) + lower_param * add) * slowdown
    ps_device = pricing.slowdown(1, workers + 1)
    upper_s = (costs.fwd(upper, workers * b) + costs.bwd(upper, workers * b)) * ps_device
    # the W lower gradient sets summed into the first, and SGD of the lower part; SGD of the upper part
    lower_server = ((workers - 1) * lower_param * add + lower_param * update) * ps_device
    upper_update = (costs.param_bytes - lower_param) * update * ps_device
    if pricing.pipelining is None:
        return compute, upper_s + upper_update + lower_server, volume["total"] / link.bytes_per_s + 4 * link.latency_s
    # full duplex, pipelined: activations and labels up; activation gradients down while the PS device
    # updates the upper part; then the lower part's push (up) and pull (down) as a pipelined `ps` step,
    # whose serving starts once the upper update is done
    up_s = (volume.get("activations", 0) + volume.get("labels", 0)) / link.bytes_per_s + link.latency_s
    down_s = volume.get("activation_gradients", 0) / link.bytes_per_s + link.latency_s
    push_s = volume.get("gradients", 0) / link.bytes_per_s
    piped_server, piped_comm = _pipelined_ps(
        pricing, backward_s, lower_server, push_s, workers, lower_param, busy_s=max(0.0, upper_update - down_s)
    )
    return compute, upper_s + piped_server, up_s + down_s + piped_comm


def _pipelined_ps(
    pricing: Pricing,
    backward_s: float,
    server_s: float,
    direction_s: float,
    workers: int,
    shard_bytes: float,
    busy_s: float = 0.0,
) -> tuple[float, float]:
    """(server, comm) seconds a pipelined PS step adds to the workers' forward+backward.

    The PS is busy for the slower of one direction of the busiest link (`direction_s`) and its
    own reduce and update (`server_s`), after `busy_s` of other work from the start of backward
    (RALP's upper update: pushes arrive meanwhile, but nothing is reduced or pulled); backward
    hides up to its own length of that; then the last bucket is updated and pulled by the
    `workers` remote workers over the PS link, behind two latencies. `shard_bytes`: the
    parameter bytes each PS holds. What backward does not hide is the end of that timeline: server
    time where it reaches into `busy_s` or the PS is compute-bound, network time otherwise.
    """
    assert pricing.pipelining is not None
    bucket_bytes = pricing.pipelining.bucket_bytes
    last = min(bucket_bytes, shard_bytes) / shard_bytes if shard_bytes else 0.0
    serving_s = max(direction_s, server_s)
    exposed = max(0.0, busy_s + serving_s - backward_s)
    busy_exposed = max(0.0, exposed - serving_s)
    tail_comm = workers * min(bucket_bytes, shard_bytes) / pricing.link.bytes_per_s + 2 * pricing.link.latency_s
    if server_s > direction_s:
        return exposed + last * server_s, tail_comm
    return busy_exposed + last * server_s, exposed - busy_exposed + tail_comm


def effective_link(
    measured_bytes_per_s: float | None,
    rate: str | None,
    latency_s: float = 0.0,
    allreduce_bytes_per_s: float | None = None,
) -> Link:
    """The slower of the measured link and the configured rate's TCP payload bandwidth."""
    candidates: list[tuple[float, str]] = []
    if measured_bytes_per_s:
        candidates.append((float(measured_bytes_per_s), "measured"))
    configured = payload_bytes_per_s(rate) if rate else None
    if configured:
        candidates.append((configured, f"configured {rate}"))
    if not candidates:
        raise ValueError(
            "no link bandwidth: the profile has no measured bandwidth and the rate is unlimited; "
            "profile without --no-bandwidth or set network.rate"
        )
    value, source = min(candidates)
    return Link(value, latency_s, source, allreduce_bytes_per_s)
