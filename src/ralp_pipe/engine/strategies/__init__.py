"""The four training strategies behind one step interface (:class:`base.Strategy`)."""

from __future__ import annotations

from ralp_pipe.engine.strategies.allreduce import AllReduceStrategy
from ralp_pipe.engine.strategies.base import Batch, Optim, StepSetup, Strategy
from ralp_pipe.engine.strategies.ps import ParameterServerStrategy, holds_model
from ralp_pipe.engine.strategies.ralp import LayerPlacementStrategy

__all__ = ["Batch", "Optim", "StepSetup", "Strategy", "build", "holds_model"]


def build(setup: StepSetup) -> Strategy:
    """The strategy named by the setup's topology, constructed for this rank."""
    kinds = {
        "ps": ParameterServerStrategy,
        "allreduce": AllReduceStrategy,
        "ralp_h": LayerPlacementStrategy,
        "ralp_n": LayerPlacementStrategy,
    }
    return kinds[setup.topology.strategy](setup)
