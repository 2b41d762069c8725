"""The smallest real training run the hostile-input tests start: two CPU ranks of ResNet-18 at 32 px."""

from __future__ import annotations

SMALL = [
    "cluster=local",
    "model=resnet18",
    "strategy=ps",
    "cluster.gpus=2",
    "train.batch_size=2",
    "train.image_size=32",
    "train.warmup_steps=1",
    "train.loader=synthetic",
]


def small(*overrides: str) -> list[str]:
    """SMALL without the keys `overrides` set (the command refuses a key given twice), then `overrides`."""
    keys = {o.partition("=")[0] for o in overrides}
    return [*(o for o in SMALL if o.partition("=")[0] not in keys), *overrides]
