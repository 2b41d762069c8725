"""Calibrating the device model on published single-GPU training throughput, and checking it on figures left out.

A published figure is one GPU training one model at one batch on synthetic (or saturating) input:
images/sec = batch / (forward + backward of every unit + one SGD step), the step the device model
prices from :func:`ralp_pipe.engine.devicemodel.trace_model`. Every GPU generation (``device.arch``)
has its own efficiencies and launch overhead: :func:`calibrate` fits each architecture of :data:`PLAN`
on the figures of its GPUs, starting from the architecture before it and freeing only the fields its
figures can tell apart; :func:`leave_one_out` runs that whole calibration once per figure without it
and predicts it. ``benchmarks/device_model.py`` prints both, and ``config/device/arch/*.yaml`` hold
what :func:`calibrate` returns on every figure.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ralp_pipe.config import DeviceConfig
from ralp_pipe.config.schema import ARCH_FIELDS
from ralp_pipe.engine.devicemodel import Kernels, trace_model, trace_update
from ralp_pipe.engine.sgd import Optim

FITTED = ARCH_FIELDS
Group = tuple[str, ...]  # fields fitted as one value
SEPARATE: tuple[Group, ...] = tuple((name,) for name in FITTED)  # every fitted field a group of its own
BOUNDS = {
    "launch_overhead_us": (0.5, 30.0),
    "memory_efficiency": (0.05, 1.0),
    "matmul_efficiency": (0.05, 1.0),
    "conv_efficiency": (0.05, 1.0),
    "conv3x3_efficiency": (0.05, 4.0),  # direct-count FLOPs: Winograd does up to 4x fewer multiplies
}


Fields = dict[str, float]  # values of the FITTED fields: one architecture's


@dataclass(frozen=True)
class Figure:
    """One published figure: `device` training `model` at `batch` (`image_size` px, 1000 classes) at
    `images_per_sec`."""

    device: str
    model: str
    batch: int
    images_per_sec: float
    source: str
    momentum: float = 0.0  # the optimiser's: TensorFlow benchmarks' "sgd" has none, DeepLearningExamples 0.875
    image_size: int = 224

    @property
    def label(self) -> str:
        """``device model@batch``."""
        return f"{self.device} {self.model}@{self.batch}"


TF_BENCHMARKS = "TensorFlow benchmarks, May 2017, 1 x P100 (DGX-1), synthetic data"
TF_K80 = "TensorFlow benchmarks, May 2017, 1 x K80 die (EC2 p2.8xlarge), synthetic data"
TF_K80_DISTRIBUTED = f"{TF_K80}, the one-GPU row of its Distributed TensorFlow table"
DLE = "NVIDIA DeepLearningExamples PyTorch ResNet-50 v1.5 (pytorch-21.03)"
INCEPTION_SIZE = 299  # Inception-v3's input in every published figure
PUBLISHED = (
    Figure("p100", "resnet50", 64, 219.0, TF_BENCHMARKS),
    Figure("p100", "resnet50", 32, 195.0, TF_BENCHMARKS),
    Figure("p100", "resnet152", 64, 91.8, TF_BENCHMARKS),
    Figure("p100", "resnet152", 32, 82.7, TF_BENCHMARKS),
    Figure("p100", "vgg16", 64, 154.0, TF_BENCHMARKS),
    Figure("p100", "vgg16", 32, 144.0, TF_BENCHMARKS),
    Figure("p100", "alexnet", 512, 2987.0, TF_BENCHMARKS),
    Figure("p100", "inception_v3", 64, 142.0, TF_BENCHMARKS, image_size=INCEPTION_SIZE),
    Figure("p100", "inception_v3", 32, 128.0, TF_BENCHMARKS, image_size=INCEPTION_SIZE),
    # EC2's one-GPU rows: AlexNet and VGG16 kept their variables on the GPU there, as the device model prices
    # the update (GCE's rows, variables on the CPU, are within 4%)
    Figure("k80", "inception_v3", 64, 30.8, TF_K80, image_size=INCEPTION_SIZE),
    Figure("k80", "resnet50", 64, 51.5, TF_K80),
    Figure("k80", "resnet152", 32, 19.7, TF_K80),
    Figure("k80", "alexnet", 512, 684.0, TF_K80),
    Figure("k80", "vgg16", 32, 36.3, TF_K80),
    Figure("k80", "inception_v3", 32, 29.2, TF_K80_DISTRIBUTED, image_size=INCEPTION_SIZE),
    Figure("k80", "resnet50", 32, 48.4, TF_K80_DISTRIBUTED),
    Figure("v100", "resnet50", 112, 367.0, f"{DLE}, 1 x V100 16 GB (DGX-1), FP32", momentum=0.875),
    Figure("a100", "resnet50", 256, 938.0, f"{DLE}, 1 x A100 80 GB (DGX A100), TF32", momentum=0.875),
)


@functools.lru_cache(maxsize=None)
def step_kernels(model: str, batch: int, momentum: float, image_size: int = 224, classes: int = 1000) -> Kernels:
    """Every kernel of one training step of `model` at `batch`: each unit forward and backward, then SGD."""
    units, traces = trace_model(model, classes, image_size, batch)
    sizes = [p.numel() * p.element_size() for u in units for p in u.module.parameters() if p.requires_grad]
    _, update = trace_update(sizes, Optim(lr=0.01, momentum=momentum, weight_decay=0.0))
    parts = [k for t in traces for k in (t.fwd, t.bwd)] + [update]
    return Kernels(
        np.concatenate([k.kind for k in parts]),
        np.concatenate([k.flops for k in parts]),
        np.concatenate([k.bytes for k in parts]),
    )


def predict(figure: Figure, device: DeviceConfig) -> float:
    """Modelled images/sec of `figure`'s training step on `device`."""
    kernels = step_kernels(figure.model, figure.batch, figure.momentum, figure.image_size)
    return figure.batch / kernels.seconds(device)


def fields_of(device: DeviceConfig) -> Fields:
    """The FITTED fields of a composed `device`."""
    return {name: float(getattr(device, name)) for name in FITTED}


def fit(figures: Sequence[Figure], entries: dict[str, DeviceConfig], start: Fields, groups: Sequence[Group]) -> Fields:
    """`start` with the fields of `groups` chosen to minimise the squared log error of `figures`' predictions,
    each figure priced on its own GPU's specs (`entries`).

    The fields of one group take one value; each stays within the :data:`BOUNDS` of its group's first
    field. With fewer figures than groups least squares returns one of the many exact solutions.
    """
    from scipy.optimize import least_squares

    low = [math.log(BOUNDS[g[0]][0]) for g in groups]
    high = [math.log(BOUNDS[g[0]][1]) for g in groups]
    x0 = [min(max(math.log(start[g[0]]), lo + 1e-6), hi - 1e-6) for g, lo, hi in zip(groups, low, high)]

    def fields_at(x: Sequence[float] | np.ndarray) -> Fields:
        return {**start, **{n: float(math.exp(v)) for g, v in zip(groups, x) for n in g}}

    def residuals(x: np.ndarray) -> list[float]:
        fields = fields_at(x)
        return [math.log(predict(f, with_fields(entries[f.device], fields)) / f.images_per_sec) for f in figures]

    return fields_at(least_squares(residuals, x0, bounds=(low, high)).x)


def with_fields(device: DeviceConfig, fields: Fields) -> DeviceConfig:
    """`device`'s specs with `fields` as its fitted fields."""
    return dataclasses.replace(device, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Step:
    """How one architecture is calibrated: from `base`'s fitted fields (None: its own shipped values), fitting
    `groups` on the published figures of its GPUs."""

    arch: str
    base: str | None
    groups: tuple[Group, ...]
    why: str


# Each architecture starts from one fitted before it and frees only what its own figures can tell apart.
PLAN = (
    Step("pascal", None, SEPARATE, "every field, on P100's 9 figures"),
    Step(
        "kepler",
        "pascal",
        (("conv_efficiency", "conv3x3_efficiency", "matmul_efficiency"), ("memory_efficiency",)),
        "Pascal's fields, one compute efficiency (every kind) and the memory efficiency refitted on K80's 7 "
        "figures: freeing each kind apart fits them closer but predicts the figures left out worse",
    ),
    Step(
        "volta",
        "pascal",
        (("memory_efficiency",),),
        "Pascal's fields, memory efficiency refitted on V100's one figure (PyTorch 2021's elementwise kernels "
        "against TensorFlow 2017's)",
    ),
    Step(
        "ampere",
        "volta",
        (("conv_efficiency", "conv3x3_efficiency"),),
        "Volta's fields, one convolution efficiency refitted on A100's one figure: TF32 tensor cores run 3x3 "
        "convolutions as implicit GEMMs, without Winograd's saving",
    ),
    Step("hopper", "ampere", (), "Ampere's fields: no published figure used"),
)


def calibrate(entries: dict[str, DeviceConfig], figures: Sequence[Figure] = PUBLISHED) -> dict[str, Fields]:
    """The fitted fields of every architecture of :data:`PLAN`, from the composed device `entries` (their specs,
    and the first architecture's shipped fields as its start)."""
    done: dict[str, Fields] = {}
    for step in PLAN:
        own = [f for f in figures if entries[f.device].arch == step.arch]
        if step.base is None:
            start = next(fields_of(e) for e in entries.values() if e.arch == step.arch)
        else:
            start = done[step.base]
        done[step.arch] = fit(own, entries, start, step.groups) if step.groups and own else start
    return done


@dataclass(frozen=True)
class Check:
    """A figure left out of a calibration and what that calibration predicted for it."""

    figure: Figure
    arch: str
    predicted: float
    fitted_on: str

    @property
    def error(self) -> float:
        """Relative error of the prediction: predicted / published - 1."""
        return self.predicted / self.figure.images_per_sec - 1.0


def leave_one_out(entries: dict[str, DeviceConfig], figures: Sequence[Figure] = PUBLISHED) -> list[Check]:
    """For every figure: the whole calibration on the others, then its prediction. A generation with one
    figure is predicted from the architecture it starts from, through its GPU's specs alone."""
    checks = []
    for held in figures:
        arch = entries[held.device].arch
        rest = [f for f in figures if f is not held]
        fitted = calibrate(entries, rest)
        own = sum(1 for f in rest if entries[f.device].arch == arch)
        step = next(s for s in PLAN if s.arch == arch)
        on = f"the other {own} {arch} figures" if own and step.groups else f"{step.base}'s fields through the specs"
        checks.append(Check(held, arch, predict(held, with_fields(entries[held.device], fitted[arch])), on))
    return checks


def by_arch(checks: Sequence[Check]) -> dict[str, list[Check]]:
    """`checks` grouped by architecture, in :data:`PLAN` order."""
    return {s.arch: [c for c in checks if c.arch == s.arch] for s in PLAN if any(c.arch == s.arch for c in checks)}


def median_abs_error(checks: Sequence[Check]) -> float:
    """Median of |error| over `checks`."""
    return statistics.median(abs(c.error) for c in checks)
