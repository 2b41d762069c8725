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

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, cast

from ralp_pipe.config import strategy_kind
from ralp_pipe.config.units import payload_bytes_per_s
from ralp_pipe.contract.records import at_batch, unit_curve
from ralp_pipe.engine.models import check_split

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
        compute, server, comm = _layer_placing_step(pricing, num_workers, cast(int, split), volume)
    else:
        world = num_workers + kind.servers(gpus, pricing.num_ps)
        # forward+backward, then zeroing the flat gradients (ps) or two bucket copies (DDP; none on one worker,
        # which trains without DDP)
        passes = 1 if kind.has_ps else 2 if num_workers > 1 else 0
        compute = _full_model_compute(pricing, passes) * pricing.slowdown(num_workers, world)
        if kind.has_ps:
            server, comm = _ps_step(pricing, num_workers, world)
        else:
            server, comm = _allreduce_step(pricing, num_workers, world, volume["total"])
    return Prediction(strategy, gpus, split, num_workers * pricing.batch_size, compute, server, comm, dict(volume))


def _full_model_compute(pricing: Pricing, passes: int) -> float:
    """A worker's forward+backward of every unit and `passes` passes over its gradients, as profiled."""
    costs, b = pricing.costs, pricing.batch_size
    return (
        costs.fwd(slice(None), b) + costs.bwd(slice(None), b) + passes * costs.param_bytes * costs.aggregate_s_per_byte
    )


def _ps_step(pricing: Pricing, workers: int, world: int) -> tuple[float, float]:
    """(server, comm) seconds of a `ps` step: each PS adds the W gradient sets into the first, averages them
    and applies SGD to its 1/num_ps of the parameters; pushes and pulls cross the busiest host link."""
    costs, link, num_ps = pricing.costs, pricing.link, pricing.num_ps
    total_param, add = costs.param_bytes, costs.aggregate_s_per_byte
    reduce_passes = workers if workers > 1 else 0
    server = (reduce_passes * add + costs.update_s_per_byte) * total_param / num_ps * pricing.slowdown(num_ps, world)
    direction_s = ps_direction_bytes(total_param, workers, num_ps, pricing.colocated) / link.bytes_per_s
    if pricing.pipelining is None:
        return server, 2 * direction_s + 2 * link.latency_s
    backward_s = costs.bwd(slice(None), pricing.batch_size) * pricing.slowdown(workers, world)
    shard_bytes = total_param / num_ps
    return _pipelined_ps(
        pricing, backward_s, server, direction_s, workers - 1 if pricing.colocated else workers, shard_bytes
    )


def _allreduce_step(pricing: Pricing, workers: int, world: int, sent: int) -> tuple[float, float]:
    """(server, comm) seconds of a ring all-reduce step: (N-1)/N of an addition and SGD, and the ring: what
    of DDP's bucketed rings outlasts backward (:attr:`Pricing.ddp_overlap`), else the whole ring after it."""
    costs, link = pricing.costs, pricing.link
    add = costs.aggregate_s_per_byte
    server = ((workers - 1) / workers * add + costs.update_s_per_byte) * costs.param_bytes
    server *= pricing.slowdown(workers, world)
    if workers <= 1:
        return server, 0.0
    if pricing.ddp_overlap:
        return server, _ddp_exposed(pricing, workers, world, sent)
    return server, sent / workers / link.ring_bytes_per_s + 2 * (workers - 1) * link.latency_s


def _ddp_exposed(pricing: Pricing, workers: int, world: int, sent: int) -> float:
    """Seconds DDP's all-reduce runs on after backward has ended (with `workers` > 1).

    Gradients fill DDP's buckets in backward's order (the last unit's first), a unit's at the end of
    its backward; a bucket is all-reduced once its last gradient exists and the bucket before has been,
    its ring moving its share of the `sent` / `workers` bytes each worker sends, plus 2(N-1) latencies.
    """
    costs, link = pricing.costs, pricing.link
    total_param = costs.param_bytes
    slowdown = pricing.slowdown(workers, world)
    ready_at: list[tuple[float, float]] = []  # (parameter bytes produced, backward seconds when they were)
    produced, elapsed = 0.0, 0.0
    for unit in reversed(costs.units):
        produced += unit.param_bytes
        elapsed += unit.bwd(pricing.batch_size) * slowdown
        ready_at.append((produced, elapsed))
    seconds_per_byte = sent / workers / max(total_param, 1) / link.ring_bytes_per_s
    ring_latency = 2 * (workers - 1) * link.latency_s
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
