"""Time-dilated emulation: every rank spends D x a target GPU's time on each unit of work.

With ``dilation.factor`` D, each placement unit's forward and backward on every rank takes D x the
target's time for that unit (``dilation.target``: a ``config/device`` entry as shipped, priced by the device
model, :func:`ralp_pipe.engine.devicemodel.modelled_profile`, or a profile file measured by ``ralp-pipe
profile``, :func:`target_profile`) at the run's batch and image size: the worker's batch, the PS device's
concatenated batch for its upper units; the servers' gradient aggregation and SGD update, and
``allreduce``'s optimizer step, likewise (per parameter byte).
Emulated links run at ``network.rate`` / D (:func:`ralp_pipe.config.dilation.shaped_rate`). The cluster then behaves like the
target cluster with time slowed by D: target-equivalent images/sec = measured x D, GB/step and
splits those of the target. Two modes (``dilation.mode``):

- ``real``: each unit runs its real computation, then waits out its padded time. The ranks may
  compute on fewer images and a smaller crop (``dilation.compute_batch_size``/``compute_image_size``)
  than the run's ``train.*``; messages whose size depends on them (RALP's activations, their
  gradients and the labels) are padded to the run's sizes, so the bytes are always the target's.
- ``modelled``: no computation. Each unit is a :class:`StandIn` holding the unit's parameters and
  producing outputs of the target's shapes in no time; its forward and backward wait out the padded
  time, and the real tensors (gradient buckets, parameters, activations and their gradients) go
  through the real communication stack in the order the target would produce them. The servers'
  aggregation and update and the optimizer steps are waited for, not run: parameters are not trained.

A unit's time excludes the communication it waited for inside it (a forward waiting for its
pulled parameters): the deadline moves by that wait.
A unit's *own* time is its wall time less that wait and less the time this host kept the rank's thread
runnable but off every core (its run delay, :func:`run_delay_s`). A unit whose own time exceeded its padded
time (by more than :data:`OVERRUN_TOLERANCE_S`) is an *overrun* (a unit the target does in no time, a
flatten, never is: no D would fit it, and what the host spends there, such as the autograd work between its
neighbours, counts as lateness): it is counted, per rank and step, and the target's timing is not
reproduced there (raise D). A unit that outlasted its padded time only because the host did not run it is
a *stall*, counted beside: the host's scheduler, not the unit's work (ranks on fewer cores than ranks).
The rank's timeline then runs behind the target's; the following units' deadlines are moved earlier by
that lateness (less the communication waited since, which absorbs it) until it is caught up, so jitter
of this host does not add up over a step. What is still late when a step ends (:meth:`Pacer.late_s`) is
recorded as ``late_s``: the time the run lost against the target.
Every pacer also keeps the largest ratio of a unit's own time to its target time at D = 1
(:attr:`Pacer.needed`): the smallest D that would have fitted. ``dilation.factor=auto`` runs the
ranks once undilated to measure it (real mode) or measures the links (modelled mode) before the run.

This module owns the decision: target times per unit and role (:class:`Targets`), the deadline
wait (:func:`wait_until`), the stand-ins (:func:`stand_ins`) and the hooks that pad (:class:`Pacer`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from omegaconf import OmegaConf
from torch import nn

from ralp_pipe.config import CONFIG_DIR, Config, ConfigError, DeviceConfig, strategy_kind
from ralp_pipe.config.compose import with_arch
from ralp_pipe.config.dilation import emulated_rate, fixed_factor
from ralp_pipe.config.schema import REAL
from ralp_pipe.contract.records import Profile, check_profile_matches
from ralp_pipe.contract.topology import Topology, hosts_of
from ralp_pipe.engine import devicemodel, models
from ralp_pipe.engine.metrics import measured_late_s, measured_overruns, measured_stalls
from ralp_pipe.engine.models import Unit, activation_shapes
from ralp_pipe.engine.sgd import Optim
from ralp_pipe.errors import DataError

SPIN_S = 1e-3  # sleep to this long before a deadline, then spin: time.sleep overshoots by up to a few ms
_schedstat = threading.local()  # per thread: its schedstat (on-CPU time, run delay, timeslices: ns), kept open
# a unit whose own time exceeds its padded time by more than this is an overrun: a flatten's 0 s target costs
# ~20 us here, and a rank on a loaded host is descheduled for a millisecond or more at times; later units catch up
OVERRUN_TOLERANCE_S = 1e-3
WORKER, PS_DEVICE_BATCH = "worker", "ps_device"  # whose batch a unit's time is priced at


def wait_until(deadline: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Return at `deadline` (a `clock` reading): sleep until :data:`SPIN_S` before it, then spin on the clock."""
    remaining = deadline - clock()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while clock() < deadline:
        pass


def run_delay_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a core (Linux's schedstat; 0.0 where the
    kernel does not keep it).

    Each thread opens its own schedstat once and re-reads it in place: opening a procfs file while the host
    moves traffic at full rate took 1-6 ms at times (the parameter server's 58 us units overran by that, 20 per
    run of VGG-11 `ps` N=2), where a re-read takes ~2 us.
    """
    stats = getattr(_schedstat, "file", None)
    try:
        if stats is None:  # closed with the thread's locals when the thread ends
            stats = _schedstat.file = open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb", buffering=0)
        return int(os.pread(stats.fileno(), 128, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Mark:
    """Where a unit began: the clock, the communication wait and the thread's run delay then."""

    clock: float
    waited: float
    stalled: float


@dataclass(frozen=True)
class Targets:
    """D x the target's seconds: per unit forward and backward at each role's batch, and the servers' work per byte."""

    factor: float
    mode: str
    device: str
    fwd_s: dict[str, list[float]]  # WORKER / PS_DEVICE_BATCH -> per unit
    bwd_s: dict[str, list[float]]
    update_s_per_byte: float  # one SGD step (momentum, weight decay) of the parameters, per byte ...
    update_s_fixed: float  # ... plus its kernels' launches, whatever their size
    aggregate_s_per_byte: float  # adding one more worker's gradient set into the sum, per byte ...
    aggregate_s_fixed: float  # ... plus its kernels' launches
    # a host's GPUs summing a set of gradients (or sharing a pulled set) over their interconnect, per byte of the set
    # (costmodel.Hosts.in_host_s); 0 at one GPU per host
    in_host_s_per_byte: float = 0.0

    @property
    def computes(self) -> bool:
        """Whether the ranks run the real computation (mode real) or only wait (mode modelled)."""
        return self.mode == REAL

    def scaled(self, factor: float) -> Targets:
        """These targets at dilation factor `factor` instead of :attr:`factor`."""
        k = factor / self.factor
        return dataclasses.replace(
            self,
            factor=factor,
            fwd_s={role: [k * s for s in times] for role, times in self.fwd_s.items()},
            bwd_s={role: [k * s for s in times] for role, times in self.bwd_s.items()},
            update_s_per_byte=k * self.update_s_per_byte,
            update_s_fixed=k * self.update_s_fixed,
            aggregate_s_per_byte=k * self.aggregate_s_per_byte,
            aggregate_s_fixed=k * self.aggregate_s_fixed,
            in_host_s_per_byte=k * self.in_host_s_per_byte,
        )

    def to_dict(self) -> dict[str, Any]:
        """The targets as JSON (handed from the driver to the ranks)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Targets:
        """Targets from :meth:`to_dict`'s JSON."""
        return cls(**data)


def targets(cfg: Config, topo: Topology, factor: float | None = None) -> Targets | None:
    """The run's padded times at `factor` (default ``dilation.factor``; None without one, or while it is
    ``auto``: see :meth:`Targets.scaled`). A device entry must hold the worker's model; a profile file
    (:func:`target_profile`, checked whenever dilation is on) gives its own times."""
    d, t, m = cfg.dilation, cfg.train, cfg.model
    factor = fixed_factor(cfg) if factor is None else factor
    profile = target_profile(cfg) if factor is not None or d.factor is not None else None
    if factor is None:
        return None
    batches = {WORKER: t.batch_size}
    if strategy_kind(topo.strategy).places_layers:
        batches[PS_DEVICE_BATCH] = t.batch_size * topo.num_workers
    in_host = factor * hosts_of(cfg).in_host_s(1.0, summed=True)
    if profile is not None:
        return _on_ps_cpu(cfg, _profiled(profile, batches, factor, d.mode, _labelled(profile, d.target), in_host))
    device = device_entry(d.target)
    traced = {
        role: devicemodel.trace_model(m.name, cfg.dataset.num_classes, t.image_size, batch, m.dropout)
        for role, batch in batches.items()
    }
    units, worker = traced[WORKER]
    params = [p.numel() * p.element_size() for u in units for p in u.module.parameters() if p.requires_grad]
    need = devicemodel.training_memory_bytes(worker, sum(params), 4 * 3 * t.image_size**2 * t.batch_size)
    devicemodel.check_fits(
        device, need, f"dilation.target={d.target}: model {m.name} at train.batch_size={t.batch_size}"
    )
    aggregate, update = devicemodel.trace_update(params, Optim(t.lr, t.momentum, t.weight_decay))
    launch_s = (
        devicemodel.efficiencies(device).launch_overhead_us * 1e-6
    )  # FlatSgd's kernels are as many for any size: launches apart

    def per_byte(kernels: devicemodel.Kernels) -> float:
        return factor * (kernels.seconds(device) - len(kernels) * launch_s) / sum(params)

    modelled = Targets(
        factor=factor,
        mode=d.mode,
        device=d.target,
        fwd_s={role: [factor * u.fwd.seconds(device) for u in traced[role][1]] for role in batches},
        bwd_s={role: [factor * u.bwd.seconds(device) for u in traced[role][1]] for role in batches},
        update_s_per_byte=per_byte(update),
        update_s_fixed=factor * len(update) * launch_s,
        aggregate_s_per_byte=per_byte(aggregate),
        aggregate_s_fixed=factor * len(aggregate) * launch_s,
        in_host_s_per_byte=in_host,
    )
    return _on_ps_cpu(cfg, modelled)


def _on_ps_cpu(cfg: Config, found: Targets) -> Targets:
    """`found` with a `dtf` PS task's work at its CPU's measured cost where the strategy gives one
    (``strategy.ps_apply_ns_per_byte``, ``strategy.rpc_us_per_tensor``): every pushed gradient applied on its own
    and two RPCs per pusher and variable, so the servers' reduce of N sets and SGD step pad to N applies."""
    s = cfg.strategy
    if s.name != "dtf":
        return found
    rpc = found.factor * 2 * s.rpc_us_per_tensor * 1e-6
    if s.ps_apply_ns_per_byte is None:
        return dataclasses.replace(
            found, update_s_fixed=found.update_s_fixed + rpc, aggregate_s_fixed=found.aggregate_s_fixed + rpc
        )
    apply = found.factor * s.ps_apply_ns_per_byte * 1e-9
    return dataclasses.replace(
        found, update_s_per_byte=apply, update_s_fixed=rpc, aggregate_s_per_byte=apply, aggregate_s_fixed=rpc
    )


def _profiled(
    profile: Profile, batches: dict[str, int], factor: float, mode: str, label: str, in_host_s_per_byte: float
) -> Targets:
    """:class:`Targets` of a measured profile: each role's unit times at its batch (interpolated as the cost model
    does), the servers' work per byte as profiled (no fixed part: the profile timed it per byte)."""
    times = {role: profile.unit_seconds(batch) for role, batch in batches.items()}
    update, aggregate = profile.seconds_per_byte()
    return Targets(
        factor=factor,
        mode=mode,
        device=label,
        fwd_s={role: [factor * s for s in fwd] for role, (fwd, _) in times.items()},
        bwd_s={role: [factor * s for s in bwd] for role, (_, bwd) in times.items()},
        update_s_per_byte=factor * update,
        update_s_fixed=0.0,
        aggregate_s_per_byte=factor * aggregate,
        aggregate_s_fixed=0.0,
        in_host_s_per_byte=in_host_s_per_byte,
    )


def target_profile(cfg: Config) -> Profile | None:
    """The profile file ``dilation.target`` names (None for a config/device entry), checked against the run: its
    model, class count, image size and unit count, and unit times and per-byte costs readable; otherwise a
    ConfigError names the key, the file and what to do. Read once per process and file (the run's record names
    it after the run)."""
    path = cfg.dilation.target_profile
    if path is None:
        return None
    m, key = cfg.model, f"dilation.target={path}"
    try:
        profile = _read_profile(path)
        check_profile_matches(profile, cfg, path)
        units = len(models.model_units(m.name, cfg.dataset.num_classes, m.dropout, "meta"))
        if len(profile.units) != units:
            raise ConfigError(
                f"profile {path} has {len(profile.units)} units but model {m.name} has {units}: "
                f"profile that model again with `ralp-pipe profile --out {path}`"
            )
        profile.unit_seconds(cfg.train.batch_size)
        profile.seconds_per_byte()
    except (ConfigError, DataError) as exc:
        raise ConfigError(f"{key}: {exc}") from exc
    return profile


@functools.lru_cache(maxsize=4)
def _read_profile(path: Path) -> Profile:
    return Profile.read(path)


def target_label(cfg: Config) -> str:
    """The target as the records name it: the device entry's name, or for a profile file what it timed
    (:attr:`Profile.device_name`) and the file's name; the file was checked against the run by :func:`targets`
    before any rank started, so it is only read (once per process), not checked again."""
    path = cfg.dilation.target_profile
    return cfg.dilation.target if path is None else _labelled(_read_profile(path), cfg.dilation.target)


def _labelled(profile: Profile, target: str) -> str:
    return f"{profile.device_name} (profile {Path(target).name})"


def with_factor(cfg: Config, factor: float) -> Config:
    """`cfg` with ``dilation.factor`` resolved to `factor` (what ``auto`` measured)."""
    return dataclasses.replace(cfg, dilation=dataclasses.replace(cfg.dilation, factor=factor))


def compute_size(cfg: Config) -> tuple[int, int]:
    """The batch per worker and the crop the ranks compute on: ``dilation.compute_*`` in real mode, else train's."""
    d, t = cfg.dilation, cfg.train
    if d.factor is None:
        return t.batch_size, t.image_size
    return d.compute_batch_size or t.batch_size, d.compute_image_size or t.image_size


def auto_factor(needed: float, margin: float) -> float:
    """The factor ``auto`` picks from the largest measured / target unit time `needed`: `margin` x it, rounded up
    to two significant digits (at least 1)."""
    raw = max(1.0, needed * margin)
    step = 10.0 ** (math.floor(math.log10(raw)) - 1)
    return round(math.ceil(raw / step - 1e-9) * step, 9)


def device_entry(name: str) -> DeviceConfig:
    """The shipped device entry `name` (``config/device/<name>.yaml``)."""
    data = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "device" / f"{name}.yaml"))
    assert isinstance(data, dict)
    return with_arch(DeviceConfig(**{str(k): v for k, v in data.items()}))


def record(cfg: Config, result: Mapping[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any] | None:
    """metrics.json's ``dilation`` record of a run (None without dilation): the factor, mode, target, link rates,
    overruns, stalls and lateness in the measured steps of rank 0's gathered `result`, the smallest factor that would
    have fitted and, with ``auto``, how the factor was chosen (`calibration`)."""
    factor = fixed_factor(cfg)
    if factor is None:
        return None
    batch, image = compute_size(cfg)
    return {
        "factor": factor,
        "mode": cfg.dilation.mode,
        "target_device": target_label(cfg),
        "target_link_rate": cfg.network.rate,
        "shaped_link_rate": emulated_rate(cfg),
        "compute_batch_size": batch,
        "compute_image_size": image,
        "overruns": measured_overruns(result["rows"]),
        "stalls": measured_stalls(result["rows"]),
        "late_s": measured_late_s(result["rows"]),
        "needed_factor": max(result["needed_factor"]),
        "auto": calibration,
    }


def paced(pacer: Pacer | None, seconds: Callable[[Pacer], float], work: Callable[[], Any]) -> None:
    """Run `work` undilated; dilated, pad it to `seconds(pacer)` (modelled mode: only wait that long)."""
    if pacer is None:
        work()
    else:
        pacer.run(seconds(pacer), work)


class Pacer:
    """One rank's padding: units' forward and backward (:meth:`attach`) and the servers' work (:meth:`run`).

    `waited` reads the communication wait counted so far (:attr:`ralp_pipe.engine.comm.Comm.wait_s`);
    what a unit waited for is added to its deadline. `stalled` reads the calling thread's run delay
    (:func:`run_delay_s`; default none), which a unit's own time excludes. `sync` waits for the device's queued
    work (on a GPU, whose kernels run after the hooks return) before a unit's end is read. :meth:`take` returns
    the overruns and stalls since the last call; :attr:`needed` is the largest ratio of a unit's own time to its target
    time at D = 1 so far. With `measure_only` nothing waits: the ranks run undilated and only measure
    :attr:`needed` (``dilation.factor=auto`` in real mode).
    """

    def __init__(
        self,
        targets: Targets,
        waited: Callable[[], float],
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] = lambda: None,
        measure_only: bool = False,
        stalled: Callable[[], float] = lambda: 0.0,
    ):
        self.targets, self.waited, self.clock, self.sync = targets, waited, clock, sync
        self.measure_only, self.stalled = measure_only, stalled
        self.overruns, self.stalls, self.needed = 0, 0, 0.0
        self.behind = 0.0  # how late this rank's timeline ran against the target's at the last unit's end (seconds)
        self._waited_seen = 0.0  # the communication wait read then

    def mark(self) -> Mark:
        """Where a unit begins now (hand it to :meth:`pad` at the unit's end)."""
        return Mark(self.clock(), self.waited(), self.stalled())

    def pad(self, began: Mark, seconds: float) -> None:
        """Wait until `seconds` (plus the communication waited since `began`, less any lateness carried) after
        `began`; count an overrun when the unit's own time exceeded `seconds` by more than
        :data:`OVERRUN_TOLERANCE_S`, a stall when only its wall time did."""
        self.sync()
        now, moved = self.clock(), self.waited() - began.waited
        wall = now - began.clock - moved
        own = wall - max(0.0, self.stalled() - began.stalled)
        if seconds > 0 and own > OVERRUN_TOLERANCE_S:  # the factor at which the overrun rule below would hold
            self.needed = max(self.needed, (own - OVERRUN_TOLERANCE_S) * self.targets.factor / seconds)
        if self.measure_only:
            return
        if seconds > 0 and own > seconds + OVERRUN_TOLERANCE_S:  # a 0 s unit's time is lateness, whatever D
            self.overruns += 1
        elif seconds > 0 and wall > seconds + OVERRUN_TOLERANCE_S:
            self.stalls += 1
        deadline = began.clock + moved + seconds - self.late_s()
        self.behind, self._waited_seen = max(0.0, now - deadline), self.waited()
        wait_until(deadline, self.clock)

    def late_s(self) -> float:
        """How late this rank's timeline runs now: the lateness at the last unit's end less the communication
        waited since (a wait for another rank absorbs it; the step's counter restarts at 0)."""
        waited = self.waited()
        since = waited - self._waited_seen if waited >= self._waited_seen else waited
        return max(0.0, self.behind - since)

    def run(self, seconds: float, work: Callable[[], Any]) -> None:
        """Run `work` (in real mode; modelled: nothing), then wait until `seconds` after it began."""
        began = self.mark()
        if self.targets.computes:
            work()
        self.pad(began, seconds)

    def update_s(self, nbytes: int) -> float:
        """Padded seconds of an SGD step over `nbytes` of parameters."""
        return self.targets.update_s_fixed + self.targets.update_s_per_byte * nbytes

    def aggregate_s(self, nbytes: int, sets: int) -> float:
        """Padded seconds of summing `sets` gradient sets of `nbytes` each (sets - 1 additions)."""
        return (self.targets.aggregate_s_fixed + self.targets.aggregate_s_per_byte * nbytes) * max(sets - 1, 0)

    def in_host_s(self, nbytes: int) -> float:
        """Padded seconds a host's GPUs take to sum a set of `nbytes` gradients over their interconnect, or to share
        a pulled set of `nbytes` (one direction, as the cost model prices it)."""
        return self.targets.in_host_s_per_byte * nbytes

    def take(self) -> tuple[int, int]:
        """Overruns and stalls since the last call."""
        counts, self.overruns, self.stalls = (self.overruns, self.stalls), 0, 0
        return counts

    def attach(self, modules: list[nn.Module], first: int, role: str) -> None:
        """Pad the forward and backward of `modules`, units ``first, first + 1, ...`` of the model, run in this
        order as a chain, at `role`'s batch (:data:`WORKER` or :data:`PS_DEVICE_BATCH`)."""
        fwd, bwd = self.targets.fwd_s[role], self.targets.bwd_s[role]
        chain = _BackwardChain(self, [bwd[first + i] for i in range(len(modules))])
        for i, module in enumerate(modules):
            self._pad_forward(module, fwd[first + i])
            chain.hook(i, module, last=i == len(modules) - 1)

    def _pad_forward(self, module: nn.Module, seconds: float) -> None:
        began = [Mark(0.0, 0.0, 0.0)]

        def start(_m: nn.Module, _args: Any) -> None:
            began[0] = self.mark()

        def end(_m: nn.Module, _args: Any, _out: Any) -> None:
            self.pad(began[0], seconds)

        module.register_forward_pre_hook(start)
        module.register_forward_hook(end)


class _BackwardChain:
    """Backward padding of a chain of units: unit i's backward begins when its output's gradient arrives (the
    last unit) or when unit i+1's padded backward ended, and ends when the last of its parameters' gradients is
    computed, before it is accumulated (its input's gradient comes from the same kernel, and an all-reduce or
    push bucket becomes ready only once it is accumulated: when the target's would), or for a unit without
    parameters, when its input's gradient is computed."""

    def __init__(self, pacer: Pacer, seconds: list[float]):
        self.pacer, self.seconds = pacer, seconds
        self.began = Mark(0.0, 0.0, 0.0)  # where the current unit's backward began
        self.left = [0] * len(seconds)  # gradients unit i still waits for in this backward
        self.params: list[int] = []

    def hook(self, i: int, module: nn.Module, last: bool) -> None:
        """Pad unit `i` (`module`); `last`: its output's gradient starts the chain's backward."""
        params = [p for p in module.parameters() if p.requires_grad]
        self.params.append(len(params))
        for p in params:
            p.register_hook(lambda _grad, i=i: self._arrived(i))

        def forward_done(_m: nn.Module, args: Any, out: Any) -> None:
            grads, x = self.params[i], args[0] if args else None
            if not grads and isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(lambda _grad: self._arrived(i))
                grads = 1
            self.left[i] = grads
            if last and isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda _grad: self._start())

        module.register_forward_hook(forward_done)

    def _start(self) -> None:
        self.began = self.pacer.mark()

    def _arrived(self, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0:
            self.pacer.pad(self.began, self.seconds[i])
            self._start()


class _NoCompute(torch.autograd.Function):
    """A unit's place in autograd without its arithmetic: forward returns an uninitialised output of the target's
    shape; backward an uninitialised input gradient and, for every parameter, an empty sparse gradient, which
    accumulates in no time whatever the parameter's size (a dense zero would cost a pass over it: ~40 ms for
    VGG's fc6 here, 100x its V100 time), so the parameter hooks of push/pull and the pacer fire in the order the
    real backward fires them, at no cost."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sample_shape: tuple[int, ...], *params: torch.Tensor) -> torch.Tensor:
        ctx.input_shape, ctx.param_shapes = x.shape, [p.shape for p in params]
        return x.new_empty((x.shape[0], *sample_shape))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_grad = grad.new_empty(ctx.input_shape) if ctx.needs_input_grad[0] else None
        return (x_grad, None, *(empty_gradient(shape, grad) for shape in ctx.param_shapes))


def empty_gradient(shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """A sparse all-zero gradient of `shape` (no stored element), `like`'s dtype and device."""
    indices = torch.empty((len(shape), 0), dtype=torch.int64, device=like.device)
    values = like.new_empty(0)
    return torch.sparse_coo_tensor(indices, values, shape, is_coalesced=True, check_invariants=False)


class StandIn(nn.Module):
    """A placement unit in ``modelled`` mode: the unit's parameters (in its order) and outputs of its shape per
    sample for whatever batch comes in, computed in no time (the pacer supplies the time)."""

    def __init__(self, module: nn.Module, sample_shape: tuple[int, ...]):
        super().__init__()
        self.sample_shape = sample_shape
        for index, param in enumerate(module.parameters()):
            self.register_parameter(f"p{index}", param)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """An output of ``(batch, *sample_shape)`` wired into autograd, without computing it."""
        return _NoCompute.apply(x, self.sample_shape, *self.parameters())


def stand_ins(units: list[Unit], image_size: int, device: str) -> list[Unit]:
    """Meta-device `units` as :class:`StandIn` units for `image_size` crops, their parameters allocated on `device`
    uninitialised (``meta``: not at all, for a rank that holds no model)."""
    with torch.device("meta"):
        shapes = activation_shapes(units, image_size)
    for unit in units:
        unit.module.to_empty(device=device)
    return [Unit(u.name, StandIn(u.module, shape[1:])) for u, shape in zip(units, shapes)]


def placeholder_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a worker feeds a modelled model: no pixels (the first stand-in ignores them) and `batch_size` labels."""
    return torch.empty(batch_size, 0), torch.zeros(batch_size, dtype=torch.int64)
