"""Time-dilated emulation, ``real`` mode: every rank spends D x a target GPU's time on each unit of work.

With ``dilation.factor`` D, every rank runs the real computation of each placement unit (forward,
backward), then waits until D x the target's modelled time for that unit (``dilation.target``, a
``config/device`` entry as shipped, :func:`ralp_pipe.planning.devicemodel.modelled_profile`, priced at
the run's batch and image size: the worker's batch, the PS device's concatenated batch for its upper units) has passed
since the unit began; the servers' gradient aggregation and SGD update, and ``allreduce``'s
optimizer step, likewise (per parameter byte). Emulated links run at ``network.rate`` / D
(:func:`shaped_rate`). The cluster then behaves like the target cluster with time slowed by D:
target-equivalent images/sec = measured x D, GB/step and parameters those of the target.

A unit's time excludes the communication it waited for inside it (a forward waiting for its
pulled parameters, a backward hook waiting for push credit): the deadline moves by that wait.
A unit whose real compute ended after its deadline (by more than :data:`OVERRUN_TOLERANCE_S`) is an
*overrun*: it is counted, per rank and step, and the target's timing is not reproduced there (raise D).

This module owns the decision: target times per unit and role (:class:`Targets`), the deadline
wait (:func:`wait_until`) and the hooks that pad (:class:`Pacer`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch
from omegaconf import OmegaConf
from torch import nn

from ralp_pipe.config import CONFIG_DIR, Config, DeviceConfig, strategy_kind
from ralp_pipe.config.units import rate_bits_per_s
from ralp_pipe.contract.topology import Topology

SPIN_S = 1e-3  # sleep to this long before a deadline, then spin: time.sleep overshoots by up to a few ms
# a unit ending later than its deadline by more than this is an overrun (a flatten's 0 s target costs ~20 us here)
OVERRUN_TOLERANCE_S = 1e-4
WORKER, PS_DEVICE_BATCH = "worker", "ps_device"  # whose batch a unit's time is priced at


def wait_until(deadline: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Return at `deadline` (a `clock` reading): sleep until :data:`SPIN_S` before it, then spin on the clock."""
    remaining = deadline - clock()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while clock() < deadline:
        pass


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

    def to_dict(self) -> dict[str, Any]:
        """The targets as JSON (handed from the driver to the ranks)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Targets:
        """Targets from :meth:`to_dict`'s JSON."""
        return cls(**data)


def targets(cfg: Config, topo: Topology) -> Targets | None:
    """The run's padded times (None without ``dilation.factor``); the target must hold the worker's model."""
    d, factor = cfg.dilation, cfg.dilation.factor
    if factor is None:
        return None
    from ralp_pipe.engine.strategies.base import Optim  # the device model traces the strategies' own update
    from ralp_pipe.planning import devicemodel  # traces the model: only for dilated runs

    device, t, m = device_entry(d.target), cfg.train, cfg.model
    batches = {WORKER: t.batch_size}
    if strategy_kind(topo.strategy).places_layers:
        batches[PS_DEVICE_BATCH] = t.batch_size * topo.num_workers
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
    launch_s = device.launch_overhead_us * 1e-6  # FlatSgd's kernels are as many for any size: launches apart

    def per_byte(kernels: devicemodel.Kernels) -> float:
        return factor * (kernels.seconds(device) - len(kernels) * launch_s) / sum(params)

    return Targets(
        factor=factor,
        mode=d.mode,
        device=d.target,
        fwd_s={role: [factor * u.fwd.seconds(device) for u in traced[role][1]] for role in batches},
        bwd_s={role: [factor * u.bwd.seconds(device) for u in traced[role][1]] for role in batches},
        update_s_per_byte=per_byte(update),
        update_s_fixed=factor * len(update) * launch_s,
        aggregate_s_per_byte=per_byte(aggregate),
        aggregate_s_fixed=factor * len(aggregate) * launch_s,
    )


def device_entry(name: str) -> DeviceConfig:
    """The shipped device entry `name` (``config/device/<name>.yaml``)."""
    data = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "device" / f"{name}.yaml"))
    assert isinstance(data, dict)
    return DeviceConfig(**{str(k): v for k, v in data.items()})


def shaped_rate(rate: str, factor: float | None) -> str:
    """The tc rate emulated links run at: `rate` / `factor` (unchanged without dilation or when unlimited)."""
    bits = rate_bits_per_s(rate)
    if factor is None or bits is None:
        return rate
    return f"{bits / factor:.0f}bit"


def record(cfg: Config, overruns: int) -> dict[str, Any] | None:
    """metrics.json's ``dilation`` record of a run (None without dilation)."""
    d = cfg.dilation
    if d.factor is None:
        return None
    return {
        "factor": d.factor,
        "mode": d.mode,
        "target_device": d.target,
        "target_link_rate": cfg.network.rate,
        "shaped_link_rate": shaped_rate(cfg.network.rate, d.factor),
        "overruns": overruns,
    }


def padded(pacer: Pacer | None, seconds: Callable[[Pacer], float]) -> ContextManager[None]:
    """`pacer`'s padding of a block to `seconds(pacer)`; nothing without a pacer (an undilated run)."""
    return contextlib.nullcontext() if pacer is None else pacer.padded(seconds(pacer))


class Pacer:
    """One rank's padding: units' forward and backward (:meth:`attach`) and the servers' work (:meth:`padded`).

    `waited` reads the communication wait counted so far (:attr:`ralp_pipe.engine.comm.Comm.wait_s`);
    what a unit waited for is added to its deadline. `sync` waits for the device's queued work (on a GPU,
    whose kernels run after the hooks return) before a unit's end is read. :meth:`take` returns the
    overruns since the last call.
    """

    def __init__(
        self,
        targets: Targets,
        waited: Callable[[], float],
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] = lambda: None,
    ):
        self.targets, self.waited, self.clock, self.sync = targets, waited, clock, sync
        self.overruns = 0

    def pad(self, began: float, waited_at_start: float, seconds: float) -> None:
        """Wait until `seconds` (plus the communication waited since `waited_at_start`) after `began`;
        count an overrun when that moment passed more than :data:`OVERRUN_TOLERANCE_S` ago."""
        self.sync()
        deadline = began + seconds + (self.waited() - waited_at_start)
        if self.clock() > deadline + OVERRUN_TOLERANCE_S:
            self.overruns += 1
        wait_until(deadline, self.clock)

    @contextlib.contextmanager
    def padded(self, seconds: float) -> Iterator[None]:
        """Run the block, then wait until `seconds` after it began."""
        began, waited = self.clock(), self.waited()
        yield
        self.pad(began, waited, seconds)

    def update_s(self, nbytes: int) -> float:
        """Padded seconds of an SGD step over `nbytes` of parameters."""
        return self.targets.update_s_fixed + self.targets.update_s_per_byte * nbytes

    def aggregate_s(self, nbytes: int, sets: int) -> float:
        """Padded seconds of summing `sets` gradient sets of `nbytes` each (sets - 1 additions)."""
        return (self.targets.aggregate_s_fixed + self.targets.aggregate_s_per_byte * nbytes) * max(sets - 1, 0)

    def take(self) -> int:
        """Overruns since the last call."""
        count, self.overruns = self.overruns, 0
        return count

    def attach(self, modules: list[nn.Module], first: int, role: str) -> None:
        """Pad the forward and backward of `modules`, units ``first, first + 1, ...`` of the model, run in this
        order as a chain, at `role`'s batch (:data:`WORKER` or :data:`PS_DEVICE_BATCH`)."""
        fwd, bwd = self.targets.fwd_s[role], self.targets.bwd_s[role]
        chain = _BackwardChain(self, [bwd[first + i] for i in range(len(modules))])
        for i, module in enumerate(modules):
            self._pad_forward(module, fwd[first + i])
            chain.hook(i, module, last=i == len(modules) - 1)

    def _pad_forward(self, module: nn.Module, seconds: float) -> None:
        began: list[float] = [0.0, 0.0]

        def start(_m: nn.Module, _args: Any) -> None:
            began[:] = [self.clock(), self.waited()]

        def end(_m: nn.Module, _args: Any, _out: Any) -> None:
            self.pad(began[0], began[1], seconds)

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
        self.began = [0.0, 0.0]  # clock and communication wait when the current unit's backward began
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
        self.began = [self.pacer.clock(), self.pacer.waited()]

    def _arrived(self, i: int) -> None:
        self.left[i] -= 1
        if self.left[i] == 0:
            self.pacer.pad(self.began[0], self.began[1], self.seconds[i])
            self._start()
