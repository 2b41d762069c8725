"""Calibrating the device model on published single-GPU training throughput, and checking it on figures left out.

A published figure is one GPU training one model at one batch on synthetic (or saturating) input:
images/sec = batch / (forward + backward of every unit + one SGD step), the step the device model
prices from :func:`ralp_pipe.engine.devicemodel.trace_model`. :func:`fit` chooses the efficiencies
and launch overhead of a device entry that minimise the squared log error over some figures;
:func:`leave_one_out` fits on all figures of a GPU but one and predicts that one, for each;
``benchmarks/device_model.py`` prints both, and the efficiencies of ``config/device/*.yaml`` are
what :func:`fit` returns on all figures of their calibration GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ralp_pipe.config import DeviceConfig
from ralp_pipe.engine.devicemodel import Kernels, trace_model, trace_update
from ralp_pipe.engine.sgd import Optim

FITTED = ("conv_efficiency", "conv3x3_efficiency", "matmul_efficiency", "memory_efficiency", "launch_overhead_us")
Group = tuple[str, ...]  # fields fitted as one value
SEPARATE: tuple[Group, ...] = tuple((name,) for name in FITTED)  # every fitted field a group of its own
BOUNDS = {
    "launch_overhead_us": (0.5, 30.0),
    "memory_efficiency": (0.05, 1.0),
    "matmul_efficiency": (0.05, 1.0),
    "conv_efficiency": (0.05, 1.0),
    "conv3x3_efficiency": (0.05, 4.0),  # direct-count FLOPs: Winograd does up to 4x fewer multiplies
}


@dataclass(frozen=True)
class Figure:
    """One published figure: `device` training `model` at `batch` (224 px, 1000 classes) at `images_per_sec`."""

    device: str
    model: str
    batch: int
    images_per_sec: float
    source: str
    momentum: float = 0.0  # the optimiser's: TensorFlow benchmarks' "sgd" has none, DeepLearningExamples 0.875

    @property
    def label(self) -> str:
        """``device model@batch``."""
        return f"{self.device} {self.model}@{self.batch}"


TF_BENCHMARKS = "TensorFlow benchmarks, May 2017, 1 x P100 (DGX-1), synthetic data"
DLE = "NVIDIA DeepLearningExamples PyTorch ResNet-50 v1.5 (pytorch-21.03)"
PUBLISHED = (
    Figure("p100", "resnet50", 64, 219.0, TF_BENCHMARKS),
    Figure("p100", "resnet50", 32, 195.0, TF_BENCHMARKS),
    Figure("p100", "resnet152", 64, 91.8, TF_BENCHMARKS),
    Figure("p100", "resnet152", 32, 82.7, TF_BENCHMARKS),
    Figure("p100", "vgg16", 64, 154.0, TF_BENCHMARKS),
    Figure("p100", "vgg16", 32, 144.0, TF_BENCHMARKS),
    Figure("p100", "alexnet", 512, 2987.0, TF_BENCHMARKS),
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
    return figure.batch / step_kernels(figure.model, figure.batch, figure.momentum).seconds(device)


def fit(figures: Sequence[Figure], start: DeviceConfig, groups: Sequence[Group] = SEPARATE) -> DeviceConfig:
    """`start` with the fields of `groups` chosen to minimise the squared log error of `figures`' predictions.

    The fields of one group take one value; each stays within the :data:`BOUNDS` of its group's first
    field. With fewer figures than groups least squares returns one of the many exact solutions.
    """
    from scipy.optimize import least_squares

    low = [math.log(BOUNDS[g[0]][0]) for g in groups]
    high = [math.log(BOUNDS[g[0]][1]) for g in groups]
    x0 = [min(max(math.log(getattr(start, g[0])), lo + 1e-6), hi - 1e-6) for g, lo, hi in zip(groups, low, high)]

    def device_at(x: Sequence[float] | np.ndarray) -> DeviceConfig:
        fields: dict[str, Any] = {n: float(math.exp(v)) for g, v in zip(groups, x) for n in g}
        return dataclasses.replace(start, **fields)

    def residuals(x: np.ndarray) -> list[float]:
        device = device_at(x)
        return [math.log(predict(f, device) / f.images_per_sec) for f in figures]

    return device_at(least_squares(residuals, x0, bounds=(low, high)).x)


@dataclass(frozen=True)
class Step:
    """How one device entry is calibrated: from `base`'s fitted fields (None: its own start), fitting `groups`
    on its published figures."""

    device: str
    base: str | None
    groups: tuple[Group, ...]
    why: str


# Each GPU's entry starts from the one before and fits only what its own figures can tell apart.
PLAN = (
    Step("p100", None, tuple((n,) for n in FITTED), "every field, on its 7 figures"),
    Step(
        "v100",
        "p100",
        (("memory_efficiency",),),
        "P100's fields, memory efficiency refitted on its one figure (PyTorch 2021's elementwise kernels against "
        "TensorFlow 2017's)",
    ),
    Step(
        "a100",
        "v100",
        (("conv_efficiency", "conv3x3_efficiency"),),
        "V100's fields, one convolution efficiency refitted on its one figure: TF32 tensor cores run 3x3 "
        "convolutions as implicit GEMMs, without Winograd's saving",
    ),
    Step("h100", "a100", (), "A100's fields: no published figure used"),
    Step("h200", "a100", (), "A100's fields: no published figure used"),
)


def calibrate(entries: dict[str, DeviceConfig], figures: Sequence[Figure] = PUBLISHED) -> dict[str, DeviceConfig]:
    """The calibrated entry of every device of :data:`PLAN`, from the `entries` as shipped (specs and start)."""
    done: dict[str, DeviceConfig] = {}
    for step in PLAN:
        start = entries[step.device]
        if step.base is not None:
            start = dataclasses.replace(start, **{n: getattr(done[step.base], n) for n in FITTED})
        own = [f for f in figures if f.device == step.device]
        done[step.device] = fit(own, start, step.groups) if step.groups and own else start
    return done


@dataclass(frozen=True)
class Check:
    """A figure left out of a fit and what the fit predicted for it."""

    figure: Figure
    predicted: float
    fitted_on: str

    @property
    def error(self) -> float:
        """Relative error of the prediction: predicted / published - 1."""
        return self.predicted / self.figure.images_per_sec - 1.0


def leave_one_out(figures: Sequence[Figure], start: DeviceConfig) -> list[Check]:
    """For every figure: fit every field on the others (of the same GPU) and predict it."""
    checks = []
    for held in figures:
        rest = [f for f in figures if f is not held]
        checks.append(Check(held, predict(held, fit(rest, start)), f"the other {len(rest)} {held.device} figures"))
    return checks


def transfer(fitted: DeviceConfig, target: DeviceConfig, figures: Sequence[Figure]) -> list[Check]:
    """Predictions of `figures` on `target`'s specs with `fitted`'s efficiencies and launch overhead."""
    moved = dataclasses.replace(target, **{n: getattr(fitted, n) for n in FITTED})
    return [Check(f, predict(f, moved), f"{fitted.name}'s fitted fields") for f in figures]


def held_out(entries: dict[str, DeviceConfig], figures: Sequence[Figure] = PUBLISHED) -> list[Check]:
    """Every check on figures left out of a fit: leave-one-out on P100, then each calibrated GPU predicting the
    next one's figures through the specs before that GPU's own refit."""
    calibrated = calibrate(entries, figures)
    checks = leave_one_out([f for f in figures if f.device == PLAN[0].device], entries[PLAN[0].device])
    for step in PLAN[1:]:
        own = [f for f in figures if f.device == step.device]
        if step.base is not None and own:
            checks += transfer(calibrated[step.base], entries[step.device], own)
    return checks


def median_abs_error(checks: Sequence[Check]) -> float:
    """Median of |error| over `checks`."""
    return statistics.median(abs(c.error) for c in checks)
