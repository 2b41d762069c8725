"""Synchronous SGD as the strategies run it: its settings (:class:`Optim`) and flat parameter sets with the
gradients received for them (:class:`FlatSgd`), which the servers update and the device model traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class Optim:
    """Synchronous SGD settings."""

    lr: float
    momentum: float
    weight_decay: float

    def sgd(self, params: list[torch.Tensor]) -> torch.optim.SGD:
        """A fused torch SGD optimiser over `params` with these settings (one pass, no temporaries)."""
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, fused=True)


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of `tensors` together."""
    return sum(t.numel() * t.element_size() for t in tensors)


class FlatSgd:
    """Parameters held as one flat tensor, the gradient sets received for them, and their SGD.

    The first receive buffer is the gradient itself: :meth:`reduce` adds the other sets into it
    in place, so a step allocates nothing and makes (sets - 1) passes over the parameters,
    plus one to average. ``ralp-pipe profile`` times :meth:`reduce` and :meth:`update` on this
    very class, so the cost model prices what the server runs.
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        sets: int,
        optim: Optim,
        mean: bool,
        inbox: Sequence[torch.Tensor] | None = None,
    ):
        self.flat = nn.Parameter(torch.cat([t.detach().reshape(-1) for t in tensors]))
        # `inbox`: the `sets` receive buffers, where the caller shares them between FlatSgds (none: its own)
        self.inbox = list(inbox) if inbox is not None else [torch.empty_like(self.flat.data) for _ in range(sets)]
        assert len(self.inbox) == sets and all(b.shape == self.flat.shape for b in self.inbox), "one buffer a set"
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
