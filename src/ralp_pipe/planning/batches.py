"""The batches a profile prices: the worker's and the PS device's of every layer-placing strategy at each N.

Torch-free, so that pricing a cached modelled profile (``ralp-pipe simulate --target``) imports no torch;
:mod:`ralp_pipe.planning.profiling` profiles at these batches.
"""

from __future__ import annotations

from typing import Sequence

from ralp_pipe.config import STRATEGY_KINDS
from ralp_pipe.contract.topology import topology


def profile_batches(batch_size: int, gpus: Sequence[int]) -> dict[str, int]:
    """Every batch a profile for the device counts `gpus` times: the worker's and each N's PS-device batches."""
    batches = {"worker": batch_size}
    for n in sorted(set(gpus)):
        batches.update(
            {f"{role}_n{n}": b for role, b in worker_and_ps_batches(batch_size, n).items() if role != "worker"}
        )
    return batches


def worker_and_ps_batches(batch_size: int, gpus: int) -> dict[str, int]:
    """Per-worker batch and the PS device's concatenated batch of every layer-placing strategy at `gpus`."""
    batches = {"worker": batch_size}
    for strategy, kind in STRATEGY_KINDS.items():
        if kind.places_layers and gpus >= kind.min_gpus:
            batches[f"ps_{strategy}"] = batch_size * topology(strategy, gpus).num_workers
    return batches
