"""What every strategy shares: its inputs, the step interface and the parameter-server pieces.

Parameters travel between workers and parameter servers in buckets (:func:`plan_buckets`):
flat runs of parameters, each served by one PS. A server (:class:`PushPullServer`) receives
each worker's gradient of a bucket, reduces them, applies SGD and sends the bucket's
parameters back; :class:`PushPullClient` is the worker side. With overlap (the default, as
Distributed TensorFlow and BytePS run), buckets leave during backward and come back during the
next forward; without it the step is sequential. SGD acts element by element, so flat buckets
give exactly the update per-tensor SGD gives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from ralp_pipe.engine.comm import Comm, Handle
from ralp_pipe.engine.models import Unit
from ralp_pipe.engine.topology import Topology, assign_to_ps

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
    overlap: bool = True
    bucket_mb: float = 4.0

    def buckets(self, sizes: list[int], servers: list[int], element_size: int) -> list[Bucket]:
        """The push/pull buckets of parameters of `sizes` elements (one per server when not overlapping)."""
        return plan_buckets(sizes, servers, bucket_elements(self.bucket_mb, element_size) if self.overlap else None)

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

    def finish(self) -> None:
        """Complete the transfers a step left in flight (called before a window edge and at the end)."""


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


@dataclass(frozen=True)
class Bucket:
    """Parameters (indices into one parameter list) that travel as one flat message to and from one server."""

    params: tuple[int, ...]
    server: int


def plan_buckets(sizes: list[int], servers: list[int], bucket_elems: int | None) -> list[Bucket]:
    """How parameters of `sizes` elements travel between workers and `servers`, in sending order.

    ``bucket_elems=None`` is the sequential layout: one bucket per server holding the parameters
    :func:`assign_to_ps` gives it, in model order. Otherwise parameters are taken in reverse model
    order (the order backward produces their gradients) into buckets of at least `bucket_elems`
    elements (0: one parameter per bucket), and buckets are spread over the servers by size.
    """
    if bucket_elems is None:
        owner = assign_to_ps(sizes, len(servers))
        grouped = [tuple(i for i in range(len(sizes)) if owner[i] == s) for s in range(len(servers))]
        return [Bucket(params, servers[s]) for s, params in enumerate(grouped) if params]
    runs: list[list[int]] = [[]]
    filled = 0
    for index in reversed(range(len(sizes))):
        if runs[-1] and filled >= bucket_elems:
            runs.append([])
            filled = 0
        runs[-1].append(index)
        filled += sizes[index]
    owner = assign_to_ps([sum(sizes[i] for i in run) for run in runs], len(servers))
    return [Bucket(tuple(run), servers[o]) for run, o in zip(runs, owner)]


def bucket_elements(bucket_mb: float, element_size: int) -> int:
    """Elements in a bucket of `bucket_mb` megabytes (10^6 bytes, as BytePS sizes its partitions)."""
    return int(bucket_mb * 1e6) // element_size


class PushPullServer:
    """A parameter server for the buckets sent to it: reduce each bucket's gradients, SGD, send it back.

    With `overlap`, a bucket is reduced, updated and sent back as soon as every worker's copy of
    it has arrived, so pulls leave while later pushes still arrive; without it the server waits
    for everything first (the sequential ablation). Receives are posted in bucket order, the
    order workers send in, so the traffic between a worker and this server is one ordered stream
    each way (what NCCL's point-to-point streams require).
    """

    def __init__(self, comm: Comm, named: list[tuple[str, torch.Tensor]], buckets: list[Bucket],
                 workers: list[int], optim: Optim, mean: bool, overlap: bool):
        self.comm, self.workers, self.overlap = comm, workers, overlap
        mine = [b for b in buckets if b.server == comm.rank]
        self.names = [[named[i][0] for i in b.params] for b in mine]
        self.shapes = [[tuple(named[i][1].shape) for i in b.params] for b in mine]
        self.buckets = [FlatSgd([named[i][1] for i in b.params], len(workers), optim, mean) for b in mine]
        self._pending: list[list[Handle]] = []

    def post_receives(self) -> None:
        """Start receiving every worker's gradients of every bucket (bucket order, then worker order)."""
        self._pending = [[self.comm.irecv(buf, w) for buf, w in zip(b.inbox, self.workers)] for b in self.buckets]

    def step(self) -> None:
        """Serve one step: receive (posting the receives unless already posted), reduce, update, send back."""
        if not self._pending:
            self.post_receives()
        pending, self._pending = self._pending, []
        sends: list[Handle] = []
        if self.overlap:
            for bucket, handles in zip(self.buckets, pending):
                self.comm.wait(handles)
                bucket.reduce()
                bucket.update()
                sends += [self.comm.isend(bucket.flat.data, w, "parameters") for w in self.workers]
        else:
            self.comm.wait([h for handles in pending for h in handles])
            for bucket in self.buckets:
                bucket.reduce()
                bucket.update()
            sends = [self.comm.isend(b.flat.data, w, "parameters") for b in self.buckets for w in self.workers]
        self.comm.wait(sends)

    def state(self) -> dict[str, torch.Tensor]:
        """The held parameters by name, in their own shapes."""
        out = {}
        for names, shapes, bucket in zip(self.names, self.shapes, self.buckets):
            pieces = torch.split(bucket.flat.detach(), [int(torch.Size(s).numel()) for s in shapes])
            out.update({n: p.reshape(s).clone() for n, p, s in zip(names, pieces, shapes)})
        return out


class PushPullClient:
    """A worker's side of the parameter servers: push gradient buckets, pull parameter buckets.

    The parameters and gradients are views into two flat buffers laid out bucket by bucket, so
    buckets go out and come in without copies. With `overlap`, a bucket is pushed from a gradient
    hook as soon as backward has produced all of it (in bucket order), the pulls are posted when
    backward ends, and the next forward waits, layer by layer, only for the buckets holding the
    parameters it is about to use (:meth:`attach`). Without it, everything is pushed after
    backward and pulled before the step returns.
    """

    def __init__(self, comm: Comm, params: list[torch.Tensor], buckets: list[Bucket], overlap: bool):
        self.comm, self.buckets, self.overlap = comm, buckets, overlap
        total = sum(p.numel() for p in params)
        self.flat_params = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
        self.flat_grads = torch.zeros_like(self.flat_params)
        self.views: list[slice] = []
        self.bucket_of: dict[int, int] = {}
        offset = 0
        for b, bucket in enumerate(buckets):
            start = offset
            for i in bucket.params:
                p, view = params[i], slice(offset, offset + params[i].numel())
                self.flat_params[view].copy_(p.detach().reshape(-1))
                p.data = self.flat_params[view].view_as(p)
                p.grad = self.flat_grads[view].view_as(p)
                self.bucket_of[id(p)] = b
                offset += p.numel()
            self.views.append(slice(start, offset))
        self._left = [len(b.params) for b in buckets]
        self._next = 0
        self._sends: list[Handle] = []
        self._pulls: dict[int, Handle] = {}
        if overlap:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_gradient)

    def attach(self, modules: list[nn.Module]) -> None:
        """Make each module's forward wait first for the pulls of the buckets holding its parameters."""
        for module in modules:
            needed = sorted({self.bucket_of[id(p)] for p in module.parameters(recurse=False) if id(p) in self.bucket_of})
            if needed:
                module.register_forward_pre_hook(lambda _m, _x, needed=needed: self.wait_pulls(needed))

    def begin(self) -> None:
        """Start a step: the last step's pushes must have completed; zero the gradients."""
        self.comm.wait(self._sends)
        self._sends = []
        self.flat_grads.zero_()
        self._left = [len(b.params) for b in self.buckets]
        self._next = 0

    def _on_gradient(self, param: torch.Tensor) -> None:
        bucket = self.bucket_of[id(param)]
        self._left[bucket] -= 1
        while self._next < len(self.buckets) and self._left[self._next] == 0:
            self._push(self._next)

    def _push(self, bucket: int) -> None:
        self._sends.append(self.comm.isend(self.flat_grads[self.views[bucket]], self.buckets[bucket].server, "gradients"))
        self._next = bucket + 1

    def end_backward(self) -> None:
        """Push what is left (every bucket without overlap), then post every bucket's pull in bucket order."""
        while self._next < len(self.buckets):
            self._push(self._next)
        self.wait_pulls(range(len(self.buckets)))  # any the forward did not wait for (unused parameters)
        for b, bucket in enumerate(self.buckets):
            self._pulls[b] = self.comm.irecv(self.flat_params[self.views[b]], bucket.server)
        if not self.overlap:
            self.finish()

    def wait_pulls(self, buckets: "range | list[int]") -> None:
        """Block until the pulls of `buckets` (those still pending) have landed."""
        self.comm.wait([self._pulls.pop(b) for b in buckets if b in self._pulls])

    def finish(self) -> None:
        """Complete every outstanding transfer (end of a measured window, or before reading parameters)."""
        self.wait_pulls(range(len(self.buckets)))
        self.comm.wait(self._sends)
        self._sends = []
