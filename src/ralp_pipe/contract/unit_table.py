"""A model's placement units as sizes only: what pricing reads of a model, without torch.

The planner, the simulator and the cost model need of a model only its units' names, which hold a dense
layer, the parameter tensors of each (their bytes, in creation order: `dtf`'s variables) and the shape of
each unit's output for one image (RALP's activations at a split). :class:`UnitTable` holds these; the device
model's trace keeps one (:func:`ralp_pipe.engine.devicemodel.unit_table`), so a cached trace prices a model
without building it. The byte functions of :mod:`ralp_pipe.engine.volume` take a table or torch units alike.

This module also holds the two small rules both sides share: which splits exist (:func:`check_split`) and
which PS task holds each of `dtf`'s variables (:func:`variable_owners`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ralp_pipe.config import ConfigError


def check_split(split: int | None, unit_count: int, source: str = "the split point") -> int:
    """`split` if it leaves at least one unit on each side of ``unit_count`` units, else a ConfigError naming `source`."""
    if split is None or not 1 <= split < unit_count:
        raise ConfigError(
            f"split point {split} (from {source}) is out of range: choose 1..{unit_count - 1} "
            f"({unit_count} placement units)"
        )
    return split


def variable_owners(sizes: Sequence[int], num_ps: int, greedy: bool = False) -> list[int]:
    """The PS task (0..num_ps-1) holding each of `dtf`'s variables of `sizes`, whole, given in creation order:
    round-robin as ``tf.train.replica_device_setter`` placed them, or with `greedy` each onto the task holding
    the fewest bytes so far (``GreedyLoadBalancingStrategy``), ties to the lowest task. The one assignment the
    cost model prices and the engine's `dtf` servers hold."""
    if num_ps < 1:
        raise ValueError(f"num_ps={num_ps} must be at least 1")
    loads, owners = [0] * num_ps, []
    for index, size in enumerate(sizes):
        task = min(range(num_ps), key=lambda p: (loads[p], p)) if greedy else index % num_ps
        loads[task] += size
        owners.append(task)
    return owners


@dataclass(frozen=True)
class UnitSize:
    """One placement unit's sizes: its name, whether it holds a dense layer, its trainable parameters (elements),
    the bytes of each of its trainable parameter tensors (creation order) and its output's shape for one image."""

    name: str
    is_dense: bool
    param_count: int
    param_bytes: tuple[int, ...]
    activation_shape: tuple[int, ...]

    @property
    def activation_elements(self) -> int:
        """Elements of the unit's output for one image."""
        return math.prod(self.activation_shape)


@dataclass(frozen=True)
class UnitTable:
    """The placement units of a model at `image_size` (a sequence of :class:`UnitSize`, in model order)."""

    units: tuple[UnitSize, ...]
    image_size: int

    def __len__(self) -> int:
        return len(self.units)

    def __iter__(self) -> Iterator[UnitSize]:
        return iter(self.units)

    def __getitem__(self, index: int) -> UnitSize:
        return self.units[index]

    @property
    def names(self) -> list[str]:
        """Every unit's name."""
        return [u.name for u in self.units]

    def split_activation_elements(self, split: int, image_size: int) -> int:
        """Elements of the activation one image produces at `split` (the output of unit ``split - 1``)."""
        if image_size != self.image_size:
            raise ValueError(f"a unit table of {self.image_size} px priced at {image_size} px")
        check_split(split, len(self))
        return self.units[split - 1].activation_elements

    def variables(self) -> list[tuple[int, int]]:
        """``(unit index, bytes)`` of every trainable parameter tensor, in creation order (`dtf`'s variables)."""
        return [(index, size) for index, unit in enumerate(self.units) for size in unit.param_bytes]

    @classmethod
    def of_rows(
        cls, rows: Sequence[dict[str, Any]], tensor_units: Sequence[int], tensor_bytes: Sequence[int], image_size: int
    ) -> UnitTable:
        """The table of a model's unit rows (:func:`ralp_pipe.engine.models.unit_rows`: ``name``, ``is_dense``,
        ``param_count``, ``activation_shape`` per image) and, per trainable tensor in creation order, its unit's
        index and its bytes."""
        if len(tensor_units) != len(tensor_bytes):
            raise ValueError(f"{len(tensor_units)} tensors' units for {len(tensor_bytes)} tensors' bytes")
        units = tuple(
            UnitSize(
                str(row["name"]),
                bool(row["is_dense"]),
                int(row["param_count"]),
                tuple(int(size) for unit, size in zip(tensor_units, tensor_bytes) if unit == index),
                tuple(int(d) for d in row["activation_shape"]),
            )
            for index, row in enumerate(rows)
        )
        return cls(units, int(image_size))
