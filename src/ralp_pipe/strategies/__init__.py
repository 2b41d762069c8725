"""The four training strategies behind one step interface (:class:`base.Strategy`)."""

from __future__ import annotations

from .allreduce import AllReduceStrategy
from .base import Batch, Optim, StepSetup, Strategy
from .ps import ParameterServerStrategy
from .ralp import LayerPlacementStrategy

__all__ = ["Batch", "Optim", "StepSetup", "Strategy", "build"]


def build(setup: StepSetup) -> Strategy:
    """The strategy named by the setup's topology, constructed for this rank."""
    kinds = {
        "ps": ParameterServerStrategy,
        "allreduce": AllReduceStrategy,
        "ralp_h": LayerPlacementStrategy,
        "ralp_n": LayerPlacementStrategy,
    }
    return kinds[setup.topology.strategy](setup)
