"""A GPU device model: what each placement unit would cost on a target GPU this machine is not.

Every unit runs once forward and once backward on the *meta* device (shapes only, no memory,
no arithmetic) under a dispatch mode that records each kernel: its FLOPs, counted by
:mod:`torch.utils.flop_counter`'s own formulas, and the bytes of every tensor it reads and
writes. View operations and allocations launch no kernel and cost nothing. A target device
(``config/device/<name>.yaml``, :class:`~ralp_pipe.config.schema.DeviceConfig`) prices a
kernel as the larger of

- compute time: FLOPs / (peak x the efficiency of its kind: convolutions, matrix multiplies), and
- memory time: bytes / (bandwidth x the memory efficiency),

plus one launch overhead, the roofline of PALEO (ICLR'17) with per-kind efficiencies fitted on
published throughput (``benchmarks/device_model.py``), as Habitat (ATC'21) calibrates per-op
scaling. Convolutions use the TF32 tensor-core peak where the device has one (cuDNN's default
in PyTorch); matrix multiplies the FP32 peak (PyTorch's default). The SGD update and the
servers' gradient aggregation are the very :class:`~ralp_pipe.engine.strategies.base.FlatSgd`
calls parameter servers run, traced the same way. Peak memory per unit is parameters +
gradients + input + output + every tensor autograd saves for backward; a worker must hold its
parameters, gradients and momentum, every unit's saved tensors and the largest unit's output
and its gradient, plus the device's reserved bytes.

:func:`modelled_profile` writes these as a profile with the schema of a measured one
(``kind: modelled``), so plans, the simulator and the workflow take either.

Tracing is the slow part (seconds per model, and torch to import); its result depends on the model, its
class count and dropout, the image size and the SGD settings, never on the batch (a unit's FLOPs and bytes
are affine in it: two traced batches give every other) nor on the device (priced afterwards). So
:func:`model_trace` keeps each trace in memory and on disk (:func:`cache_dir`), keyed by those settings, the
device model's version, the torch and torchvision versions and a hash of the code that traces; a cached trace
is priced without importing torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
import zipfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from ralp_pipe.atomic import atomic_path
from ralp_pipe.config import Config, ConfigError, DeviceConfig, device_entries, made_for
from ralp_pipe.config.schema import ARCH_FIELDS
from ralp_pipe.contract.unit_table import UnitTable

if TYPE_CHECKING:  # torch and the models are imported where a model is traced, so a cached trace needs neither
    from ralp_pipe.engine import models
    from ralp_pipe.engine.sgd import Optim

MODEL_VERSION = "roofline-2"  # bump when the pricing changes: profiles record which model priced them
KINDS = ("conv", "conv3x3", "matmul", "memory")  # conv3x3: 3x3 stride-1, where cuDNN may use Winograd
_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh"}
NEAREST = {(3, 7): "k80", (6, 0): "p100", (7, 0): "v100", (8, 0): "a100", (9, 0): "h100"}  # compute capability -> entry
MEMORY_METHOD = "modelled: params + grads + input + output + autograd-saved tensors (meta device)"


@dataclass(frozen=True)
class Kernels:
    """The kernels of one pass: kind index (into :data:`KINDS`), FLOPs and bytes read + written of each."""

    kind: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[tuple[int, float, float]]) -> Kernels:
        """Kernels from ``(kind, flops, bytes)`` rows."""
        table = np.array(rows, dtype=float).reshape(-1, 3)
        return cls(table[:, 0].astype(int), table[:, 1], table[:, 2])

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def total_flops(self) -> float:
        """FLOPs of every kernel together."""
        return float(self.flops.sum())

    @property
    def total_bytes(self) -> float:
        """Bytes read and written by every kernel together."""
        return float(self.bytes.sum())

    def seconds(self, device: DeviceConfig) -> float:
        """Modelled seconds of these kernels on `device`: per kernel max(compute, memory) + launch."""
        fitted = efficiencies(device)
        flops_per_s = np.array(compute_rates(device))
        compute = self.flops / flops_per_s[self.kind]
        memory = self.bytes / (device.memory_gbps * 1e9 * fitted.memory)
        return float(np.maximum(compute, memory).sum() + len(self) * fitted.launch_overhead_us * 1e-6)


@dataclass(frozen=True)
class Efficiencies:
    """The fitted fields of a device (its own, or its architecture's: :func:`ralp_pipe.config.compose.with_arch`)."""

    conv: float
    conv3x3: float
    matmul: float
    memory: float
    launch_overhead_us: float


def efficiencies(device: DeviceConfig) -> Efficiencies:
    """`device`'s fitted fields; a device not composed through the configuration (null fields) is refused."""
    values = [getattr(device, name) for name in ARCH_FIELDS]
    if any(v is None for v in values):
        raise ConfigError(
            f"device {device.name} has no {', '.join(n for n, v in zip(ARCH_FIELDS, values) if v is None)}: "
            f"compose it with ralp_pipe.config.load (or with_arch) so its arch {device.arch!r} supplies them"
        )
    return Efficiencies(*values)


def compute_rates(device: DeviceConfig) -> tuple[float, float, float, float]:
    """Achieved FLOP/s of each kernel kind on `device` (memory kernels: infinite, they are bandwidth-bound)."""
    fitted = efficiencies(device)
    conv_peak = (device.peak_tf32_tflops or device.peak_fp32_tflops) * 1e12
    return (
        conv_peak * fitted.conv,
        conv_peak * fitted.conv3x3,
        device.peak_fp32_tflops * 1e12 * fitted.matmul,
        math.inf,
    )


def _kind(op: str, args: Sequence[Any]) -> int:
    """Kind index of a FLOP-counted op: a convolution (3x3 stride-1 or other) or a matrix multiply."""
    if "convolution" not in op:
        return KINDS.index("matmul")
    weight, stride = (args[1], args[3]) if op == "convolution" else (args[2], args[4])
    winograd = tuple(weight.shape[-2:]) == (3, 3) and all(s == 1 for s in stride)
    return KINDS.index("conv3x3" if winograd else "conv")


@functools.cache
def _kernel_trace_class() -> type:
    """The dispatch mode recording ``(kind, flops, bytes)`` of every kernel dispatched while active (defined on
    first use: it subclasses a torch class)."""
    import torch
    from torch.utils import flop_counter
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class KernelTrace(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, float, float]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            if func.is_view or packet.__name__ in _FREE:
                return out
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            nbytes = float(sum(t.numel() * t.element_size() for t in tensors))
            counter = flop_counter.flop_registry.get(packet)
            if counter is None:
                self.rows.append((KINDS.index("memory"), 0.0, nbytes))
            else:
                self.rows.append((_kind(packet.__name__, args), float(counter(*args, **kwargs, out_val=out)), nbytes))
            return out

        def take(self) -> Kernels:
            """The kernels recorded so far, forgetting them."""
            rows, self.rows = self.rows, []
            return Kernels.of(rows)

    return KernelTrace


def _kernel_trace() -> Any:
    """A fresh kernel-recording dispatch mode (:func:`_kernel_trace_class`)."""
    return _kernel_trace_class()()


@dataclass(frozen=True)
class UnitTrace:
    """One unit at one batch: forward and backward kernels, its output shape and memory."""

    fwd: Kernels
    bwd: Kernels
    output_shape: tuple[int, ...]
    saved_bytes: int  # tensors autograd keeps for backward
    peak_memory_bytes: int  # params + grads + input + output + saved


def trace_unit(unit: models.Unit, input_shape: Sequence[int], input_grad: bool) -> UnitTrace:
    """Kernels and memory of one forward + backward of `unit` (built on the meta device) at `input_shape`."""
    import torch

    from ralp_pipe.engine.sgd import nbytes

    module = unit.module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    x = torch.empty(*input_shape, device="meta", requires_grad=input_grad)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        return t

    trace = _kernel_trace()
    with trace, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    fwd = trace.take()
    seed = torch.ones_like(out)
    if out.requires_grad:
        with trace:
            out.backward(seed)
    for p in params:
        p.grad = None
    saved_bytes = sum(saved.values())
    peak = 2 * nbytes(params) + nbytes([x]) + nbytes([out]) + saved_bytes
    return UnitTrace(fwd, trace.take(), tuple(out.shape), saved_bytes, peak)


def trace_model(
    name: str, num_classes: int, image_size: int, batch: int, dropout: float = 0.5
) -> tuple[list[models.Unit], list[UnitTrace]]:
    """The placement units of model `name` (on the meta device) and the trace of each at `batch`."""
    from ralp_pipe.engine import models

    units = models.model_units(name, num_classes, dropout, "meta")
    traces: list[Any] = []
    shape: tuple[int, ...] = (batch, 3, image_size, image_size)
    for index, unit in enumerate(units):
        traces.append(trace_unit(unit, shape, input_grad=index > 0))
        shape = traces[-1].output_shape
    return units, traces


TRACED_BATCHES = (2, 3)  # two consecutive batches traced (batch norm in training needs two values per channel)


def _at_batch(first: UnitTrace, second: UnitTrace, batch: int) -> UnitTrace:
    """The trace of a unit at `batch` from its traces at :data:`TRACED_BATCHES`: every kernel's FLOPs and bytes,
    and the memory, are affine in the batch (a tensor's size is the batch times its per-image size, or
    independent of the batch), the kernels themselves the same at every batch."""
    step = batch - TRACED_BATCHES[0]

    def affine(a: Any, b: Any) -> Any:
        return a + step * (b - a)

    def kernels(a: Kernels, b: Kernels) -> Kernels:
        return Kernels(a.kind, affine(a.flops, b.flops), affine(a.bytes, b.bytes))

    return UnitTrace(
        kernels(first.fwd, second.fwd),
        kernels(first.bwd, second.bwd),
        (batch, *first.output_shape[1:]),
        affine(first.saved_bytes, second.saved_bytes),
        affine(first.peak_memory_bytes, second.peak_memory_bytes),
    )


def trace_batches(
    name: str, num_classes: int, image_size: int, batches: Sequence[int], dropout: float = 0.5
) -> tuple[list[models.Unit], dict[int, list[UnitTrace]]]:
    """:func:`trace_model` at every batch of `batches`, from two traces (:func:`_at_batch`), so a thousand
    batches cost what two do."""
    units, first = trace_model(name, num_classes, image_size, TRACED_BATCHES[0], dropout)
    _, second = trace_model(name, num_classes, image_size, TRACED_BATCHES[1], dropout)
    return units, {b: [_at_batch(a, c, b) for a, c in zip(first, second)] for b in sorted(set(batches))}


def trace_update(param_bytes_by_tensor: Sequence[int], optim: Optim) -> tuple[Kernels, Kernels]:
    """Kernels of the servers' gradient aggregation (two sets summed) and of one SGD step, on FlatSgd."""
    import torch

    from ralp_pipe.engine.sgd import FlatSgd, Optim

    tensors = [torch.empty(n // 4, device="meta") for n in param_bytes_by_tensor]
    flat = FlatSgd(tensors, sets=2, optim=Optim(optim.lr, optim.momentum, optim.weight_decay), mean=False)
    flat.optimizer = torch.optim.SGD(
        [flat.flat], lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay
    )  # the fused kernel has no meta implementation; the per-tensor step reads and writes the same bytes
    flat.update()  # the first step creates the momentum buffer; a steady-state step is traced
    trace = _kernel_trace()
    with trace:
        flat.reduce()
    aggregate = trace.take()
    with trace:
        flat.update()
    return aggregate, trace.take()


def training_memory_bytes(traces: Sequence[UnitTrace], param_bytes: int, input_bytes: int) -> int:
    """Bytes one worker holds training every unit of `traces`: parameters, gradients and momentum, the
    saved tensors of every unit, the input, and the largest unit's output with its gradient."""
    largest_output = max(t.peak_memory_bytes - t.saved_bytes for t in traces)
    return 3 * param_bytes + sum(t.saved_bytes for t in traces) + input_bytes + largest_output


def check_fits(device: DeviceConfig, need_bytes: int, what: str) -> None:
    """Refuse `what` when `need_bytes` exceed the device's memory less its reserved bytes, naming the bytes short."""
    have = (device.memory_gb - device.reserved_gb) * 1e9
    if need_bytes > have:
        raise ConfigError(
            f"{what} needs {need_bytes / 1e9:.1f} GB on {device.name} ({device.memory_gb:g} GB, "
            f"{device.reserved_gb:g} reserved): {(need_bytes - have) / 1e9:.1f} GB short; "
            f"lower train.batch_size or train.image_size, or choose a device with more memory"
        )


@dataclass(frozen=True)
class ModelTrace:
    """What the device model prices of one model at one image size, whatever the device and the batch: its unit
    table (:func:`ralp_pipe.engine.models.unit_rows`), the bytes of each trainable parameter tensor in creation
    order and the index of the unit holding it, every unit traced at the two batches of :data:`TRACED_BATCHES` (:func:`trace_model`), and the
    servers' aggregation and SGD step (:func:`trace_update`)."""

    rows: list[dict[str, Any]]
    param_tensors: list[int]
    param_units: list[int]
    traced: tuple[list[UnitTrace], list[UnitTrace]]
    aggregate: Kernels
    update: Kernels

    def table(self, image_size: int) -> UnitTable:
        """The model's units as sizes only (what pricing reads of them), at the `image_size` it was traced at."""
        return UnitTable.of_rows(self.rows, self.param_units, self.param_tensors, image_size)

    def at(self, batches: Sequence[int]) -> dict[int, list[UnitTrace]]:
        """Every unit's trace at each of `batches` (:func:`_at_batch`)."""
        first, second = self.traced
        return {b: [_at_batch(a, c, b) for a, c in zip(first, second)] for b in sorted(set(batches))}


class Sgd(Protocol):
    """The SGD settings a trace reads (:class:`~ralp_pipe.engine.sgd.Optim`, or a config's ``train``)."""

    @property
    def lr(self) -> float: ...

    @property
    def momentum(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...


# the code a trace comes from (beside torch's and torchvision's versions): a change to any of them misses the cache
TRACED_BY = ("engine/devicemodel.py", "engine/models.py", "engine/sgd.py")
CACHE_FORMAT = 2  # what a cached trace holds (2: each parameter tensor's unit); bump when it changes
CACHE_ENV = "RALP_PIPE_CACHE"  # a folder for cached traces, or "off"
_TRACES: dict[str, ModelTrace] = {}  # this process's traces, by cache key


def cache_dir() -> Path | None:
    """Where traces are cached: ``$RALP_PIPE_CACHE`` (None where it is ``off``), else ``$XDG_CACHE_HOME/ralp-pipe``,
    else ``~/.cache/ralp-pipe``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None and chosen.strip().lower() in ("off", "0", "no", "false", ""):
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralp-pipe"


@functools.cache
def code_version() -> dict[str, str]:
    """What besides the settings decides a trace: the device model's version, a hash of :data:`TRACED_BY` and the
    torch and torchvision versions (read from their metadata: neither is imported)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in TRACED_BY:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    versions = {}
    for package in ("torch", "torchvision"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "?"
    return {"model_version": MODEL_VERSION, "code": digest.hexdigest()[:16], **versions}


def trace_key(name: str, num_classes: int, image_size: int, dropout: float, optim: Sgd) -> dict[str, Any]:
    """Everything a trace of model `name` depends on (:func:`model_trace`'s cache key)."""
    return {
        "model": name,
        "num_classes": int(num_classes),
        "image_size": int(image_size),
        "dropout": float(dropout),
        "lr": float(optim.lr),
        "momentum": float(optim.momentum),
        "weight_decay": float(optim.weight_decay),
        "cache_format": CACHE_FORMAT,
        **code_version(),
    }


def model_trace(name: str, num_classes: int, image_size: int, dropout: float, optim: Sgd) -> ModelTrace:
    """The :class:`ModelTrace` of model `name`: this process's, else the cached one (:func:`cache_dir`), else
    traced (importing torch) and cached."""
    text, path, found = _cached(name, num_classes, image_size, dropout, optim)
    if found is None:
        found = _trace(name, num_classes, image_size, dropout, optim)
        if path is not None:
            _write_trace(path, text, found)
        _TRACES[text] = found
    return found


def _cached(
    name: str, num_classes: int, image_size: int, dropout: float, optim: Sgd
) -> tuple[str, Path | None, ModelTrace | None]:
    """The cache key's text of a trace, its cache file (None: no cache) and the trace this process or the cache
    holds (None: none)."""
    key = trace_key(name, num_classes, image_size, dropout, optim)
    text = json.dumps(key, sort_keys=True)
    folder = cache_dir()
    path = (
        None
        if folder is None
        else folder / f"{name}-{image_size}px-{hashlib.sha256(text.encode()).hexdigest()[:20]}.npz"
    )
    if text in _TRACES:
        return text, path, _TRACES[text]
    found = None if path is None else _read_trace(path, text)
    if found is not None:
        _TRACES[text] = found
    return text, path, found


def unit_table(name: str, num_classes: int, image_size: int, dropout: float, optim: Sgd) -> UnitTable:
    """Model `name`'s units as sizes only (:class:`~ralp_pipe.contract.unit_table.UnitTable`): its trace's where
    this process or the cache holds one (no torch), else of the units built on the meta device (torch, no trace)."""
    found = _cached(name, num_classes, image_size, dropout, optim)[2]
    if found is not None:
        return found.table(image_size)
    from ralp_pipe.engine import models

    return models_table(models.model_units(name, num_classes, dropout, "meta"), image_size)


def models_table(units: Sequence[models.Unit], image_size: int) -> UnitTable:
    """The :class:`~ralp_pipe.contract.unit_table.UnitTable` of torch `units` at `image_size` (their shapes
    computed: on the meta device, nothing)."""
    from ralp_pipe.engine import models

    tensors = [(i, p.numel() * p.element_size()) for i, u in enumerate(units) for p in u.module.parameters()
               if p.requires_grad]  # fmt: skip
    rows = models.unit_rows(units, models.activation_shapes(list(units), image_size))
    return UnitTable.of_rows(rows, [i for i, _ in tensors], [size for _, size in tensors], image_size)


def _trace(name: str, num_classes: int, image_size: int, dropout: float, optim: Sgd) -> ModelTrace:
    """:class:`ModelTrace` of model `name`, traced."""
    from ralp_pipe.engine import models
    from ralp_pipe.engine.sgd import Optim

    units, first = trace_model(name, num_classes, image_size, TRACED_BATCHES[0], dropout)
    _, second = trace_model(name, num_classes, image_size, TRACED_BATCHES[1], dropout)
    tensors = [(i, p.numel() * p.element_size()) for i, u in enumerate(units) for p in u.module.parameters()
               if p.requires_grad]  # fmt: skip
    param_tensors, param_units = [size for _, size in tensors], [i for i, _ in tensors]
    rows = models.unit_rows(units, [(1, *trace.output_shape[1:]) for trace in first])
    aggregate, update = trace_update(param_tensors, Optim(optim.lr, optim.momentum, optim.weight_decay))
    return ModelTrace(rows, param_tensors, param_units, (first, second), aggregate, update)


def _kernel_arrays(prefix: str, kernels: Sequence[Kernels]) -> dict[str, np.ndarray]:
    return {
        f"{prefix}_count": np.array([len(k) for k in kernels], dtype=np.int64),
        f"{prefix}_kind": np.concatenate([k.kind for k in kernels]).astype(np.int64),
        f"{prefix}_flops": np.concatenate([k.flops for k in kernels]).astype(np.float64),
        f"{prefix}_bytes": np.concatenate([k.bytes for k in kernels]).astype(np.float64),
    }


def _kernels_of(arrays: Any, prefix: str) -> list[Kernels]:
    ends = np.cumsum(arrays[f"{prefix}_count"])
    parts = [np.split(arrays[f"{prefix}_{field}"], ends[:-1]) for field in ("kind", "flops", "bytes")]
    return [Kernels(kind, flops, nbytes) for kind, flops, nbytes in zip(*parts)]


def _write_trace(path: Path, key: str, trace: ModelTrace) -> None:
    """Cache `trace` at `path` (atomically; a folder that cannot be written is left alone: the cache only saves
    time)."""
    arrays: dict[str, np.ndarray] = {}
    units: list[list[Any]] = []
    for index, traces in enumerate(trace.traced):
        arrays |= _kernel_arrays(f"t{index}_fwd", [t.fwd for t in traces])
        arrays |= _kernel_arrays(f"t{index}_bwd", [t.bwd for t in traces])
        units.append([[list(t.output_shape), int(t.saved_bytes), int(t.peak_memory_bytes)] for t in traces])
    arrays |= _kernel_arrays("aggregate", [trace.aggregate]) | _kernel_arrays("update", [trace.update])
    meta = {
        "key": key,
        "rows": trace.rows,
        "param_tensors": trace.param_tensors,
        "param_units": trace.param_units,
        "units": units,
    }
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as out:
            savez: Any = np.savez  # numpy's stubs take every keyword for its allow_pickle
            savez(out, meta=np.array(json.dumps(meta)), **arrays)
    except OSError:
        pass


def _read_trace(path: Path, key: str) -> ModelTrace | None:
    """The trace cached at `path` for `key`; None where there is none, or it is unreadable or another key's."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            meta = json.loads(str(arrays["meta"]))
            if meta["key"] != key:
                return None
            traced = []
            for index, units in enumerate(meta["units"]):
                fwd, bwd = _kernels_of(arrays, f"t{index}_fwd"), _kernels_of(arrays, f"t{index}_bwd")
                traced.append(
                    [UnitTrace(f, b, tuple(shape), saved, peak) for f, b, (shape, saved, peak) in zip(fwd, bwd, units)]
                )
            (aggregate,), (update,) = _kernels_of(arrays, "aggregate"), _kernels_of(arrays, "update")
            first, second = traced
            if not len(first) == len(second) == len(meta["rows"]) or len(meta["param_units"]) != len(
                meta["param_tensors"]
            ):
                return None
            return ModelTrace(
                meta["rows"], meta["param_tensors"], meta["param_units"], (first, second), aggregate, update
            )
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None


def modelled_profile(cfg: Config, batches: dict[str, int], gpus: int) -> dict[str, Any]:
    """A profile document of `cfg`'s model on the target `cfg.device`, with the schema of a measured one.

    `batches` maps roles to the batches to price (the worker's and each N's PS-device batches, as
    :func:`ralp_pipe.planning.profiling.profile_batches` gives them). The worker's whole model at its batch
    must fit the device's memory. The model's trace is :func:`model_trace`'s (cached).
    """
    started = time.perf_counter()
    device, t = cfg.device, cfg.train
    traced = model_trace(cfg.model.name, cfg.dataset.num_classes, t.image_size, cfg.model.dropout, t)
    by_batch = traced.at(list(batches.values()))
    worker = by_batch[batches["worker"]]
    param_bytes = sum(traced.param_tensors)
    need = training_memory_bytes(worker, param_bytes, 4 * 3 * t.image_size**2 * batches["worker"])
    check_fits(device, need, f"model {cfg.model.name} at train.batch_size={batches['worker']} ({t.image_size} px)")
    rows = [dict(row) for row in traced.rows]
    for index, row in enumerate(rows):
        row["by_batch"] = {str(b): _priced(traces[index], device) for b, traces in by_batch.items()}
    aggregate_s, update_s = traced.aggregate.seconds(device), traced.update.seconds(device)
    return {
        **made_for(cfg),
        "gpus": gpus,
        "batches": batches,
        "device": "cuda",
        "kind": "modelled",
        "target": asdict(device),
        "model_version": MODEL_VERSION,
        "training_backend": "nccl",
        "cluster_kind": cfg.cluster.kind,
        "memory_method": MEMORY_METHOD,
        "link": {"measured": None, "configured_rate": None, "configured_bytes_per_s": None},
        "units": rows,
        "update": {
            "param_bytes": param_bytes,
            "update_s": update_s,
            "aggregate_s": aggregate_s,
            "update_s_per_byte": update_s / param_bytes,
            "aggregate_s_per_byte": aggregate_s / param_bytes,
        },
        "worker_memory_bytes": need,
        "profile_seconds": time.perf_counter() - started,
    }


def _priced(trace: UnitTrace, device: DeviceConfig) -> dict[str, Any]:
    return {
        "fwd_s": trace.fwd.seconds(device),
        "bwd_s": trace.bwd.seconds(device),
        "peak_memory_bytes": trace.peak_memory_bytes,
        "fwd_flops": trace.fwd.total_flops,
        "bwd_flops": trace.bwd.total_flops,
        "fwd_bytes": trace.fwd.total_bytes,
        "bwd_bytes": trace.bwd.total_bytes,
        "kernels": len(trace.fwd) + len(trace.bwd),
    }


def target_overrides(target: str, overrides: Sequence[str], probe: Callable[[], Any] | None = None) -> list[str]:
    """`overrides` with the device group set to `target` (a shipped entry, or ``auto``: this machine's GPU).

    The user's own ``device.*`` overrides adjust the entry (a key the user gives replaces the one this adds);
    a ``device=`` override naming another entry than `target` is refused.
    """

    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    chosen = [o for o in overrides if key(o) == "device"]
    if chosen and any(o.split("=", 1)[1] != target for o in chosen):
        raise ConfigError(f"--target {target} and {chosen[0]} name two devices: give one")
    if target == "auto":
        added = local_gpu_overrides(probe)
    elif target in device_entries():
        added = [f"device={target}"]
    else:
        raise ConfigError(
            f"--target {target!r} is no device entry; choose one of: {', '.join(device_entries())} or auto "
            f"(or add config/device/{target}.yaml)"
        )
    given = {key(o) for o in overrides}
    return [*(o for o in added if key(o) not in given), *overrides]


def local_gpu_overrides(probe: Callable[[], Any] | None = None) -> list[str]:
    """Overrides describing this machine's first CUDA GPU: the shipped entry its name names, or the entry of
    the nearest compute capability with this GPU's memory and name (`probe`: torch.cuda.get_device_properties)."""
    if probe is None:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--target auto needs a CUDA GPU on this machine; name a device entry instead")
        props = torch.cuda.get_device_properties(0)
    else:
        props = probe()
    name = str(props.name).lower()
    match = next((d for d in device_entries() if d in name.replace(" ", "").replace("-", "")), None)
    if match is None:
        capability = (props.major, props.minor)
        match = min(NEAREST.items(), key=lambda kv: abs(kv[0][0] - capability[0]) * 10 + abs(kv[0][1] - capability[1]))[
            1
        ]
    label = name.replace("nvidia", "").strip().replace(" ", "-") or match
    return [f"device={match}", f"device.name={label}", f"device.memory_gb={props.total_memory / 1e9:.2f}"]


def describe(device: DeviceConfig) -> str:
    """One line naming a device and its peaks."""
    tensor = f", TF32 {device.peak_tf32_tflops:g}" if device.peak_tf32_tflops else ""
    return (
        f"{device.name} ({device.peak_fp32_tflops:g} TFLOP/s FP32{tensor}, {device.memory_gbps:g} GB/s, "
        f"{device.memory_gb:g} GB)"
    )
