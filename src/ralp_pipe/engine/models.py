"""torchvision CNNs as ordered lists of placement units, and the split into lower/upper parts.

A placement unit is the smallest group of layers the planner may place on one side of the
split: a conv (+BN) + ReLU, a pooling layer, a residual or Inception block, a flatten, a linear
layer with its activation and dropout. The units reuse torchvision's own modules, so parameter counts
are torchvision's exactly, and ``nn.Sequential(*units)`` computes what the original model does.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torchvision import models as tvm

from ralp_pipe.config import MODELS
from ralp_pipe.contract.unit_table import check_split as check_split  # torch-free, the cost model's too

# Inception-v3's modules in the order its forward runs them, up to the pooled features
INCEPTION_BLOCKS = (
    "Conv2d_1a_3x3",
    "Conv2d_2a_3x3",
    "Conv2d_2b_3x3",
    "maxpool1",
    "Conv2d_3b_1x1",
    "Conv2d_4a_3x3",
    "maxpool2",
    "Mixed_5b",
    "Mixed_5c",
    "Mixed_5d",
    "Mixed_6a",
    "Mixed_6b",
    "Mixed_6c",
    "Mixed_6d",
    "Mixed_6e",
    "Mixed_7a",
    "Mixed_7b",
    "Mixed_7c",
    "avgpool",
)


@dataclass(frozen=True)
class Unit:
    """One placement unit: a name for tables and the module that computes it."""

    name: str
    module: nn.Module

    @property
    def is_dense(self) -> bool:
        """True when the unit holds a fully connected layer."""
        return any(isinstance(m, nn.Linear) for m in self.module.modules())


def build(name: str, num_classes: int, dropout: float = 0.5) -> nn.Module:
    """The torchvision model `name` with `num_classes` outputs and random weights."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    factory = getattr(tvm, name)
    if name.startswith(("vgg", "alexnet")):
        return factory(weights=None, num_classes=num_classes, dropout=dropout)
    if name == "inception_v3":  # the main head only: the auxiliary classifier is no placement unit
        return factory(weights=None, num_classes=num_classes, dropout=dropout, aux_logits=False, init_weights=True)
    return factory(weights=None, num_classes=num_classes)


def model_units(name: str, num_classes: int, dropout: float, device: str = "cpu") -> list[Unit]:
    """The placement units of a freshly built model `name`, initialised on `device` (meta: shapes only, no memory,
    no initialisation)."""
    with torch.device(device), _MetaUninitialised() if device == "meta" else contextlib.nullcontext():
        return placement_units(build(name, num_classes, dropout))


class _MetaUninitialised(TorchFunctionMode):
    """Initialising a meta tensor leaves it as it is: it holds no values to initialise. (torch runs the meta
    version of ``normal_``, which the models' ``kaiming_normal_`` calls, as Python reference code: building every
    model on the meta device took seconds, most of them initialising.)"""

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            tensor = args[0] if args else kwargs.get("tensor")  # torch.nn.init's hands its tensor by name
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


# what initialises a tensor in place: torch.nn.init's functions (each returns the tensor it was given, its first
# argument, `tensor`) and the random fills they call
_RANDOM_FILLS = frozenset(
    {torch.Tensor.normal_, torch.Tensor.uniform_}
    | {getattr(nn.init, name) for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")}
)


def _group_sequential(prefix: str, seq: nn.Sequential) -> list[Unit]:
    """Split a feature/classifier Sequential into units that end at each pooling layer, ReLU or dropout run."""
    units: list[Unit] = []
    current: list[nn.Module] = []
    anchors = (nn.Conv2d, nn.Linear, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)
    for layer in seq:
        if isinstance(layer, anchors) and current:
            units.append(_unit(prefix, len(units), current))
            current = []
        current.append(layer)
    if current:
        units.append(_unit(prefix, len(units), current))
    return units


def _unit(prefix: str, index: int, layers: list[nn.Module]) -> Unit:
    head = layers[0]
    kind = {nn.Conv2d: "conv", nn.Linear: "fc", nn.MaxPool2d: "pool", nn.AvgPool2d: "pool"}.get(
        type(head), type(head).__name__.lower()
    )
    module = layers[0] if len(layers) == 1 else nn.Sequential(*layers)
    return Unit(f"{prefix}{index}_{kind}", module)


def placement_units(model: nn.Module) -> list[Unit]:
    """The model as an ordered list of placement units whose composition equals the model."""
    if isinstance(model, (tvm.VGG, tvm.AlexNet)):
        return [
            *_group_sequential("features.", model.features),
            Unit("avgpool", model.avgpool),
            Unit("flatten", nn.Flatten(1)),
            *_group_sequential("classifier.", model.classifier),
        ]
    if isinstance(model, tvm.ResNet):
        stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        blocks = [
            Unit(f"layer{i}.{j}", block) for i in range(1, 5) for j, block in enumerate(getattr(model, f"layer{i}"))
        ]
        return [
            Unit("stem", stem),
            *blocks,
            Unit("avgpool", model.avgpool),
            Unit("flatten", nn.Flatten(1)),
            Unit("fc", model.fc),
        ]
    if isinstance(model, tvm.Inception3):
        if model.AuxLogits is not None or model.transform_input:
            raise TypeError("placement units of Inception-v3 need aux_logits=False and transform_input=False")
        return [
            *(Unit(name, getattr(model, name)) for name in INCEPTION_BLOCKS),
            Unit("dropout", model.dropout),
            Unit("flatten", nn.Flatten(1)),
            Unit("fc", model.fc),
        ]
    raise TypeError(f"no placement units defined for {type(model).__name__}")


def default_split(units: list[Unit]) -> int:
    """Index of the first dense unit: the lower part is every conv/pool unit before it."""
    for index, unit in enumerate(units):
        if unit.is_dense:
            return index
    raise ValueError("model has no fully connected unit to place on the PS device")


def split(units: list[Unit], k: int) -> tuple[nn.Sequential, nn.Sequential]:
    """Lower part (units[:k], run by workers) and upper part (units[k:], run by the PS device)."""
    check_split(k, len(units))
    return nn.Sequential(*(u.module for u in units[:k])), nn.Sequential(*(u.module for u in units[k:]))


def parameter_count(module: nn.Module) -> int:
    """Number of trainable parameters (elements) of `module`."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def activation_shapes(units: list[Unit], image_size: int, batch: int = 1) -> list[tuple[int, ...]]:
    """Output shape of every unit for a `batch` of `image_size` x `image_size` RGB images."""
    shapes: list[tuple[int, ...]] = []
    device = next((p.device for u in units for p in u.module.parameters()), None)  # meta units: shapes only
    x = torch.zeros(batch, 3, image_size, image_size, device=device)
    with torch.no_grad():
        for unit in units:
            training = unit.module.training
            unit.module.eval()
            x = unit.module(x)
            unit.module.train(training)
            shapes.append(tuple(x.shape))
    return shapes


def unit_rows(units: Sequence[Unit], shapes: Sequence[tuple[int, ...]]) -> list[dict[str, Any]]:
    """The size columns of the unit table: names, parameter and activation bytes per unit."""
    dense_index = next((i for i, u in enumerate(units) if u.is_dense), len(units))
    rows = []
    for index, (unit, shape) in enumerate(zip(units, shapes)):
        params = [p for p in unit.module.parameters() if p.requires_grad]
        rows.append(
            {
                "index": index,
                "name": unit.name,
                "is_dense": unit.is_dense,
                "before_first_dense": index < dense_index,
                "param_count": sum(p.numel() for p in params),
                "param_bytes": sum(p.numel() * p.element_size() for p in params),
                "activation_shape": list(shape[1:]),
                "activation_bytes_per_sample": 4 * math.prod(shape[1:]),
            }
        )
    return rows


def activation_bytes(units: list[Unit], image_size: int, batch: int, value_bytes: int = 4) -> int:
    """Memory a training step keeps for backward, at least: every unit's output for `batch` images.

    `units` are on the meta device (their shapes cost nothing to compute); values take `value_bytes`.
    Layers inside a unit keep more, so the true figure is higher.
    """
    with torch.device("meta"):
        shapes = activation_shapes(units, image_size)
    return sum(math.prod(shape) for shape in shapes) * batch * value_bytes
