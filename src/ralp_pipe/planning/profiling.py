"""Hardware profile of one model: per-unit compute time, bytes and memory, plus the link bandwidth.

`ralp-pipe profile --out FILE.json <overrides>` writes one
:class:`~ralp_pipe.contract.records.Profile` per model x class count x batch x image size x
hardware; the workflow profiles compute alone (``--no-bandwidth``) once per N of the
experiment (``cluster.gpus``) and probes each network once (``--link-only``, a
:class:`~ralp_pipe.contract.records.LinkProbe`), and the planner combines the two. For every
placement unit it records forward and backward time (the fastest of `repeats` after `warmup`
runs, each unit timed in isolation on an input of the right shape: a slower repeat here is the
host's or the allocator's interference, e.g. a large gradient's pages faulted in afresh when the
profile's heap could not reuse freed memory, which a training rank's steady loop does not see)
at the per-worker batch and at the PS device's concatenated batches (ralp_n and ralp_h at
each N of ``--gpus``, default `cluster.gpus`), parameter bytes, output activation bytes and peak memory. Peak memory is
``torch.cuda.max_memory_allocated`` during the unit's forward+backward on GPU; on CPU it is
the bytes of parameters + gradients + input + output + every tensor autograd saves for the
backward pass (counted with ``saved_tensors_hooks``). It also records the SGD update and
gradient-aggregation cost per parameter byte, the hardware, and the link between two ranks
as the link probe measured it (:mod:`ralp_pipe.planning.link_probe`, ``--bandwidth-repeats``
messages each way).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ralp_pipe.atomic import check_writable
from ralp_pipe.config import ConfigError, cluster_kind, device_entries, load, made_for
from ralp_pipe.contract.records import Profile
from ralp_pipe.contract.topology import largest_world
from ralp_pipe.engine import devicemodel, models
from ralp_pipe.engine.sgd import FlatSgd, Optim
from ralp_pipe.planning.batches import profile_batches as profile_batches  # its old home
from ralp_pipe.planning.batches import worker_and_ps_batches as worker_and_ps_batches
from ralp_pipe.planning.link_probe import link_record
from ralp_pipe.runtime import devices, hardware

# what a compute profile reads of the config (a key covers those below it)
CONFIG_KEYS = (
    "experiment.target",  # a GPU to model the profile for instead of measuring this machine
    "device",  # the target's entry (read only where experiment.target is set)
    "dataset.name",
    "dataset.num_classes",
    "model",
    "strategy.num_ps",
    "cluster.kind",
    "cluster.gpus",  # N: its PS-device batches, the threads of a rank of its largest run
    "experiment.strategies",  # ... of the experiment's strategies (dtf's PS task per host makes 2N ranks)
    "cluster.device",
    "cluster.backend",
    "train.batch_size",
    "train.image_size",
    "train.lr",
    "train.momentum",
    "train.weight_decay",
    "train.seed",
)
# what the link probe (--link-only: link_probe.link_record) reads, declared here with the command's other keys
LINK_CONFIG_KEYS = ("network", "cluster.kind")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of one call of `fn`, synchronising the device before and after."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Timing:
    """How a unit or the update is timed: `warmup` untimed runs, then the fastest of `repeats` timed ones."""

    warmup: int = 1
    repeats: int = 3


def _fastest_time(fn: Callable[[], Any], device: torch.device, timing: Timing) -> float:
    """Fastest wall time of `timing.repeats` calls of `fn` after `timing.warmup` untimed calls."""
    for _ in range(timing.warmup):
        fn()
    return min(_timed(fn, device) for _ in range(timing.repeats))


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def profile_unit(
    unit: models.Unit, input_shape: Sequence[int], device: torch.device, timing: Timing, input_grad: bool
) -> dict[str, Any]:
    """Forward/backward time (fastest repeat), every sample and peak memory of one unit on a random input."""
    module = unit.module.to(device).train()
    x = torch.randn(*input_shape, device=device, requires_grad=input_grad)
    params = [p for p in module.parameters() if p.requires_grad]
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["out"] = module(x)

    def backward() -> None:
        out = state.pop("out")
        if out.requires_grad:
            out.backward(torch.ones_like(out))

    def forward_backward() -> None:
        forward()
        backward()

    for _ in range(timing.warmup):
        forward_backward()
    fwd_times: list[float] = []
    bwd_times: list[float] = []
    for _ in range(timing.repeats):
        fwd_times.append(_timed(forward, device))
        bwd_times.append(_timed(backward, device))
    return {
        "fwd_s": min(fwd_times),
        "bwd_s": min(bwd_times),
        "fwd_samples_s": fwd_times,
        "bwd_samples_s": bwd_times,
        "peak_memory_bytes": _peak_memory(module, x, params, device),
    }


def _peak_memory(module: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor], device: torch.device) -> int:
    """Peak bytes of one forward+backward (see the module docstring for the CPU measure)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        out = module(x)
        out.backward(torch.ones_like(out))
        _sync(device)
        return int(torch.cuda.max_memory_allocated(device))
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    out_bytes = out.numel() * out.element_size()
    if out.requires_grad:
        out.backward(torch.ones_like(out))
    return 2 * _tensor_bytes(params) + _tensor_bytes([x]) + out_bytes + sum(saved.values())


def profile_update(model: nn.Module, timing: Timing, optim: Optim) -> dict[str, float]:
    """Seconds per parameter byte of adding one gradient set into another and of one SGD step.

    Both are timed on :class:`~ralp_pipe.engine.strategies.base.FlatSgd` holding all of `model`'s
    parameters, the very code parameter servers run, with the training run's SGD settings.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    flat = FlatSgd(params, sets=2, optim=optim, mean=False)
    for buf in flat.inbox:
        buf.normal_()
    device, nbytes = flat.flat.device, _tensor_bytes(params)
    aggregate_s = _fastest_time(flat.reduce, device, timing)
    update_s = _fastest_time(flat.update, device, timing)
    return {
        "param_bytes": nbytes,
        "update_s": update_s,
        "aggregate_s": aggregate_s,
        "update_s_per_byte": update_s / nbytes,
        "aggregate_s_per_byte": aggregate_s / nbytes,
    }


def profile_model(
    model: nn.Module,
    image_size: int,
    batches: Sequence[int],
    device: torch.device,
    timing: Timing = Timing(),
    optim: Optim = Optim(lr=0.01, momentum=0.9, weight_decay=0.0),
) -> dict[str, Any]:
    """Per-unit table (times per batch, bytes, memory) and update cost of `model` (from :func:`models.build`;
    the random inputs continue the random state it was built in)."""
    units = models.placement_units(model)
    shapes = models.activation_shapes(units, image_size)
    in_shapes = [(3, image_size, image_size), *(s[1:] for s in shapes[:-1])]
    rows = []
    for index, (row, in_shape) in enumerate(zip(models.unit_rows(units, shapes), in_shapes)):
        row["by_batch"] = {
            str(b): profile_unit(units[index], (b, *in_shape), device, timing, input_grad=index > 0) for b in batches
        }
        rows.append(row)
    model.to(device)
    return {"units": rows, "update": profile_update(model, timing, optim)}


def rank_threads(cfg: Any, gpus: int | None = None) -> int | None:
    """Torch threads of a CPU training rank of `cfg` on this host, the fewest any experiment strategy's rank gets.

    Ranks of a local or emulated cluster share this host's CPUs, so the largest world of any of
    ``experiment.strategies`` at `gpus` (default `cluster.gpus`) sets the share; under SLURM a rank gets its task's
    CPUs. None where training runs on GPUs (torch's own threads then only feed the device).
    """
    if devices.resolve_device(cfg.cluster.device) != "cpu":
        return None
    shares = cluster_kind(cfg.cluster.kind).shares_host_cpus
    return hardware.threads_per_rank(
        largest_world(gpus or cfg.cluster.gpus, cfg.strategy.num_ps, cfg.experiment.strategies) if shares else 1
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe profile`."""
    parser.add_argument("--out", required=True, type=Path, help="profile JSON file to write")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per unit and batch (fastest)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per unit and batch")
    parser.add_argument("--message-mb", type=float, default=64.0, help="bandwidth probe message size (MiB)")
    parser.add_argument("--bandwidth-repeats", type=int, default=8, help="timed messages per direction")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the two-rank bandwidth probe")
    parser.add_argument(
        "--link-only", action="store_true", help="only probe the link: write a link record, no compute profile"
    )
    parser.add_argument(
        "--gpus",
        type=int,
        nargs="+",
        default=None,
        help="device counts to profile PS-device batches for (default: cluster.gpus); threads follow the largest",
    )
    parser.add_argument(
        "--target",
        help="model the profile for a GPU instead of measuring: a config/device entry ("
        + ", ".join(device_entries())
        + ") or auto (this machine's GPU); device.* overrides adjust it",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads while profiling (default: the threads a training rank gets here)",
    )


def device_counts(cfg: Any, gpus: Sequence[int]) -> list[int]:
    """The device counts to profile PS-device batches for, sorted: `gpus`, else `cluster.gpus`."""
    counts = sorted(set(gpus or [cfg.cluster.gpus]))
    if counts[0] < 1:
        raise ConfigError(f"--gpus {' '.join(map(str, counts))}: every device count must be at least 1")
    return counts


def build_profile(
    cfg: Any, timing: Timing, message_bytes: int, bandwidth_repeats: int, bandwidth: bool, gpus: Sequence[int] = ()
) -> dict[str, Any]:
    """The whole profile document of `cfg`'s model, dataset and this machine, for the device counts `gpus`
    (default `cluster.gpus`)."""
    if timing.repeats < 1 or timing.warmup < 0:
        raise ConfigError(f"--repeats={timing.repeats} must be >= 1 and --warmup={timing.warmup} >= 0")
    counts = device_counts(cfg, gpus)
    device_type, backend = devices.resolve(
        cfg.cluster, largest_world(counts[-1], cfg.strategy.num_ps, cfg.experiment.strategies)
    )
    device = torch.device(device_type)
    batches = profile_batches(cfg.train.batch_size, counts)
    started = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    model = models.build(cfg.model.name, cfg.dataset.num_classes, cfg.model.dropout)
    optim = Optim(cfg.train.lr, cfg.train.momentum, cfg.train.weight_decay)
    body = profile_model(model, cfg.train.image_size, sorted(set(batches.values())), device, timing, optim)
    probe = link_record(cfg, message_bytes, bandwidth_repeats, bandwidth)
    link = {k: getattr(probe, k) for k in ("measured", "configured_rate", "configured_bytes_per_s")}
    return {
        **made_for(cfg),
        "gpus": counts[-1],
        "batches": batches,
        "device": device.type,
        "kind": "measured",
        "training_backend": backend,
        "cluster_kind": cfg.cluster.kind,
        "warmup": timing.warmup,
        "repeats": timing.repeats,
        "memory_method": "cuda.max_memory_allocated"
        if device.type == "cuda"
        else "params + grads + input + output + autograd-saved tensors (bytes)",
        "hardware": {**hardware.describe(), "versions": hardware.versions()},
        "link": link,
        **body,
        "profile_seconds": time.perf_counter() - started,
    }


def main(args: argparse.Namespace) -> int:
    """Profile the configured model on this machine and write the JSON file."""
    hardware.keep_freed_memory()  # as training ranks run (the probe's ranks call it themselves)
    check_writable(args.out.parent, f"--out {args.out}")
    cfg = load(args.overrides)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads={args.threads} must be at least 1")
    message_bytes = int(args.message_mb * 2**20)
    target = args.target or (
        None if args.link_only else cfg.experiment.target
    )  # an experiment's links are this machine's
    if target:
        return _write_modelled(args, target)
    if args.link_only:
        if args.no_bandwidth:
            raise ConfigError("--link-only and --no-bandwidth exclude each other: the link record is the probe")
        probe = link_record(cfg, message_bytes, args.bandwidth_repeats)
        probe.write(args.out)
        measured = probe.measured or {}
        print(
            f"link {probe.network} ({measured.get('network')}): {measured['bytes_per_s'] / 1e9:.3g} GB/s -> {args.out}"
        )
        return 0
    largest = max(args.gpus) if args.gpus else None
    threads, previous = args.threads or rank_threads(cfg, largest), torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    try:
        timing = Timing(args.warmup, args.repeats)
        doc = build_profile(cfg, timing, message_bytes, args.bandwidth_repeats, not args.no_bandwidth, args.gpus or ())
    finally:
        torch.set_num_threads(previous)
    Profile.from_dict(doc, args.out).write(args.out)
    bw = doc["link"]["measured"]
    bw_text = f", link {bw['bytes_per_s'] / 1e9:.2f} GB/s" if bw else ""
    print(
        f"profile {doc['model']}/{doc['dataset']} on {doc['device']}: {len(doc['units'])} units, "
        f"{doc['profile_seconds']:.1f} s{bw_text} -> {args.out}"
    )
    return 0


def _write_modelled(args: argparse.Namespace, target: str) -> int:
    """`ralp-pipe profile --target NAME` (or ``experiment.target``): the modelled profile of the configured
    model on that GPU."""
    if args.link_only:
        raise ConfigError(f"--link-only probes this machine's link; it models no target device ({target})")
    cfg = load(devicemodel.target_overrides(target, args.overrides))
    counts = device_counts(cfg, args.gpus or ())
    doc = devicemodel.modelled_profile(cfg, profile_batches(cfg.train.batch_size, counts), counts[-1])
    Profile.from_dict(doc, args.out).write(args.out)
    worker = doc["batches"]["worker"]
    step = sum(u["by_batch"][str(worker)]["fwd_s"] + u["by_batch"][str(worker)]["bwd_s"] for u in doc["units"])
    print(
        f"modelled profile {doc['model']}/{doc['dataset']} on {devicemodel.describe(cfg.device)}: "
        f"{len(doc['units'])} units, forward+backward {step * 1e3:.1f} ms at batch {worker}, "
        f"{doc['worker_memory_bytes'] / 1e9:.1f} GB per worker -> {args.out}"
    )
    return 0
