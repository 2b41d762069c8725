"""Profiles computed instead of measured, for the planner, simulator and strategy-table tests."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ralp_pipe.engine import models


def unit_macs(units: Sequence[models.Unit], image_size: int) -> list[int]:
    """Multiply-accumulates of each unit's forward pass for one image (conv and linear layers)."""
    counts: dict[int, int] = {}
    hooks = []

    def count(module: nn.Module, _: Any, output: torch.Tensor) -> None:
        spatial = output.shape[2] * output.shape[3] if output.dim() == 4 else 1
        counts[id(module)] = module.get_parameter("weight").numel() * spatial

    for unit in units:
        hooks += [
            m.register_forward_hook(count) for m in unit.module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))
        ]
    try:
        models.activation_shapes(list(units), image_size)
    finally:
        for hook in hooks:
            hook.remove()
    return [sum(counts.get(id(m), 0) for m in u.module.modules()) for u in units]


def analytic_profile(
    name: str,
    num_classes: int,
    image_size: int,
    batches: Sequence[int],
    macs_per_s: float,
    bandwidth_bytes_per_s: float | None,
    memory_bytes_per_s: float,
    latency_s: float = 0.0,
) -> dict[str, Any]:
    """A profile document computed instead of measured, for hardware not at hand.

    Forward time is the unit's multiply-accumulates / `macs_per_s` (backward twice that);
    gradient aggregation and the SGD update stream parameters at `memory_bytes_per_s`
    (aggregation reads and writes once, the update with momentum three times). The model is built and run
    on the meta device: shapes and counts only, none of its weights initialised or computed.
    """
    units = models.model_units(name, num_classes, 0.5, "meta")  # models.build's default dropout
    with torch.device("meta"):
        shapes = models.activation_shapes(units, image_size)
        counts = unit_macs(units, image_size)
    rows = models.unit_rows(units, shapes)
    for row, macs in zip(rows, counts):
        row["macs_per_sample"] = macs
        row["by_batch"] = {
            str(b): {"fwd_s": macs * b / macs_per_s, "bwd_s": 2 * macs * b / macs_per_s} for b in batches
        }
    param_bytes = sum(r["param_bytes"] for r in rows)
    return {
        "model": name,
        "num_classes": num_classes,
        "image_size": image_size,
        "device": "analytic",
        "batches": {str(b): b for b in batches},
        "units": rows,
        "update": {
            "param_bytes": param_bytes,
            "update_s_per_byte": 3 / memory_bytes_per_s,
            "aggregate_s_per_byte": 1 / memory_bytes_per_s,
        },
        "link": {
            "measured": None
            if bandwidth_bytes_per_s is None
            else {"bytes_per_s": bandwidth_bytes_per_s, "latency_s": latency_s}
        },
    }
