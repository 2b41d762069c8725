"""The training strategies behind one step interface (:class:`base.Strategy`); which class runs which
strategy is the strategy table's (:mod:`ralp_pipe.config.strategies`)."""

from __future__ import annotations

from typing import Callable

from ralp_pipe.config import strategy_kind
from ralp_pipe.engine.strategies.base import Batch, Optim, StepSetup, Strategy
from ralp_pipe.engine.strategies.ps import holds_model

__all__ = ["Batch", "Optim", "StepSetup", "Strategy", "build", "holds_model"]


def build(setup: StepSetup) -> Strategy:
    """The strategy named by the setup's topology (its step class in the strategy table), constructed for this rank."""
    step: Callable[[StepSetup], Strategy] = strategy_kind(setup.topology.strategy).step_class
    return step(setup)
