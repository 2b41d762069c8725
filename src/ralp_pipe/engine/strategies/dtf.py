"""Distributed TensorFlow's parameter servers, the baseline the RALP paper measured against (`dtf`).

As :mod:`ralp_pipe.engine.strategies.ps` runs (the same push/pull server and client, pipelined as
``strategy.overlap`` says), except where the parameters live: each variable (parameter tensor) whole
on one PS task, placed as the cost model prices it (:func:`ralp_pipe.engine.volume.variable_owners`:
round-robin in creation order as ``tf.train.replica_device_setter`` did, or greedily by size), so one
large variable (VGG's fc6) loads one task's link. Each variable travels as one message each way, as
TensorFlow's ``RecvTensor`` sends a tensor. The strategy table gives `dtf` one PS task per worker host,
colocated with its worker by default (``strategy.ps_placement``), as Distributed TensorFlow was deployed.

With one GPU per host (``cluster.gpus_per_node=1``), `distributed_replicated` (a host's GPUs summed
before the push) and `parameter_server` (every GPU pushing) are the same step: each worker pushes its
own gradients, which is what the cost model prices at G = 1. On hosts of several GPUs
(``strategy.variable_update``): `distributed_replicated` sums a host's gradients inside it and pushes once
per host, as `ps` does there (:class:`ralp_pipe.engine.strategies.ps.HostLeaderClient`); `parameter_server`
keeps every GPU pushing its own.
"""

from __future__ import annotations

from ralp_pipe.config.schema import VARIABLE_UPDATES
from ralp_pipe.engine.strategies.base import Bucket, FlatLayout, StepSetup
from ralp_pipe.engine.strategies.ps import ParameterServerStrategy
from ralp_pipe.engine.volume import variable_owners

GREEDY = "greedy"  # strategy.variable_placement: each variable onto the least-loaded task
SUMMED = VARIABLE_UPDATES[0]  # strategy.variable_update distributed_replicated: a host's GPUs summed, one push


def variable_buckets(sizes: list[int], servers: list[int], greedy: bool) -> list[Bucket]:
    """One bucket per parameter of `sizes` elements (model order), whole, on the PS rank of `servers` its
    variable's task is (:func:`variable_owners`), in sending order: the flat layout's (the order backward
    produces gradients)."""
    layout = FlatLayout(tuple(sizes))
    owners, offsets = variable_owners(sizes, len(servers), greedy), layout.offsets()
    return [Bucket(offsets[i], offsets[i] + sizes[i], servers[owners[i]]) for i in layout.order if sizes[i]]


class WholeVariableStrategy(ParameterServerStrategy):
    """The `dtf` strategy on one rank (worker or PS task)."""

    @staticmethod
    def sums_in_host(setup: StepSetup) -> bool:
        """Whether a host's workers sum their gradients before one push (``variable_update``'s
        `distributed_replicated`), or every worker pushes its own (`parameter_server`)."""
        return setup.variable_update == SUMMED

    @staticmethod
    def server_buckets(setup: StepSetup, sizes: list[int], element_size: int) -> list[Bucket]:
        """Each parameter whole in a bucket of its own, on its variable's PS task."""
        return variable_buckets(sizes, setup.topology.ps, setup.variable_placement == GREEDY)
