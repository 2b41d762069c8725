"""What every strategy shares: its inputs, the step interface and the parameter-server pieces.

A parameter server (:class:`ShardServer`) holds a set of parameters as one flat tensor; every
step it receives one flat gradient per worker, reduces them, applies SGD and sends the flat
parameters back. :class:`ShardClient` is the worker side: it pushes its gradients and pulls
the parameters of one shard. SGD acts element by element, so one flat tensor gives exactly the
update per-tensor SGD gives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from ralp_pipe.engine.comm import Comm, Handle
from ralp_pipe.engine.models import Unit
from ralp_pipe.engine.topology import Topology

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Optim:
    """Synchronous SGD settings."""

    lr: float
    momentum: float
    weight_decay: float

    def sgd(self, params: list[torch.Tensor]) -> torch.optim.SGD:
        """A fused torch SGD optimiser over `params` with these settings (one pass, no temporaries)."""
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, fused=True)


@dataclass
class StepSetup:
    """Everything a strategy needs on one rank."""

    topology: Topology
    comm: Comm
    units: list[Unit]
    split: int | None
    optim: Optim
    device: torch.device
    batch_size: int
    image_size: int
    amp: bool = False

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.comm.rank

    @property
    def role(self) -> str:
        """This rank's role in the topology."""
        return self.topology.role(self.rank)

    def network(self) -> nn.Sequential:
        """The whole model as a Sequential of its units, on this rank's device."""
        return nn.Sequential(*(u.module for u in self.units)).to(self.device)

    def autocast(self) -> torch.autocast:
        """Mixed precision (bfloat16) for forward passes when `amp` is set on a CUDA device."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp and self.device.type == "cuda")


class Strategy(ABC):
    """One synchronous SGD step of the global batch, as seen from one rank."""

    @abstractmethod
    def step(self, batch: Batch | None) -> None:
        """Run one training step; workers get their (images, labels), server ranks get None."""

    @abstractmethod
    def state(self) -> dict[str, torch.Tensor]:
        """Parameters this rank holds authoritatively, by their name in the whole model."""


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the batch (the loss every strategy minimises)."""
    return nn.functional.cross_entropy(logits.float(), labels)


class FlatSgd:
    """Parameters held as one flat tensor, the gradient sets received for them, and their SGD.

    The first receive buffer is the gradient itself: :meth:`reduce` adds the other sets into it
    in place, so a step allocates nothing and makes (sets - 1) passes over the parameters,
    plus one to average. ``ralp-pipe profile`` times :meth:`reduce` and :meth:`update` on this
    very class, so the cost model prices what the server runs.
    """

    def __init__(self, tensors: list[torch.Tensor], sets: int, optim: Optim, mean: bool):
        self.flat = nn.Parameter(torch.cat([t.detach().reshape(-1) for t in tensors]))
        self.inbox = [torch.empty_like(self.flat.data) for _ in range(sets)]
        self.flat.grad = self.inbox[0]
        self.mean = mean
        self.optimizer = optim.sgd([self.flat])

    def reduce(self) -> None:
        """Sum (or average) the received gradient sets into the gradient."""
        grad = self.inbox[0]
        for other in self.inbox[1:]:
            grad.add_(other)
        if self.mean and len(self.inbox) > 1:
            grad.div_(len(self.inbox))

    def update(self) -> None:
        """One SGD step of the flat parameters."""
        self.optimizer.step()


class ShardServer:
    """A parameter server for `named` parameters: reduce worker gradients, SGD, send parameters."""

    def __init__(self, comm: Comm, named: list[tuple[str, torch.Tensor]], workers: list[int], optim: Optim, mean: bool):
        self.comm = comm
        self.names = [name for name, _ in named]
        self.shapes = [tuple(t.shape) for _, t in named]
        self.params = FlatSgd([t for _, t in named], len(workers), optim, mean)
        self.workers = workers

    def step(self) -> None:
        """Receive every worker's gradients, update the parameters and send them to every worker."""
        self.comm.wait([self.comm.irecv(buf, w) for buf, w in zip(self.params.inbox, self.workers)])
        self.params.reduce()
        self.params.update()
        self.comm.wait([self.comm.isend(self.params.flat.data, w, "parameters") for w in self.workers])

    def state(self) -> dict[str, torch.Tensor]:
        """The held parameters by name, in their own shapes."""
        sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        pieces = torch.split(self.params.flat.detach(), sizes)
        return {n: p.reshape(s).clone() for n, p, s in zip(self.names, pieces, self.shapes)}


class ShardClient:
    """A worker's link to one parameter server: push the shard's gradients, pull its parameters.

    The shard's parameters and gradients are views into two flat buffers, so gradients go out
    and parameters come in without extra copies (the worker holds 2x the shard's bytes).
    """

    def __init__(self, comm: Comm, params: list[torch.Tensor], server: int):
        self.comm = comm
        self.server = server
        total = sum(p.numel() for p in params)
        self.flat_params = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
        self.flat_grads = torch.zeros_like(self.flat_params)
        offset = 0
        for p in params:
            view = slice(offset, offset + p.numel())
            self.flat_params[view].copy_(p.detach().reshape(-1))
            p.data = self.flat_params[view].view_as(p)
            p.grad = self.flat_grads[view].view_as(p)
            offset += p.numel()

    def zero_grad(self) -> None:
        """Zero the shard's gradients in place (the gradient views must stay attached)."""
        self.flat_grads.zero_()

    def push(self) -> list[Handle]:
        """Start sending the shard's gradients and receiving its new parameters straight into the model."""
        return [self.comm.isend(self.flat_grads, self.server, "gradients"), self.comm.irecv(self.flat_params, self.server)]
