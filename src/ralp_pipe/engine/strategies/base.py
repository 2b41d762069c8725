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

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ralp_pipe.config.schema import StrategyConfig
from ralp_pipe.contract.topology import Topology, assign_to_ps
from ralp_pipe.engine.comm import CONTROL, SETUP, Comm, Handle
from ralp_pipe.engine.dilation import Pacer, paced
from ralp_pipe.engine.models import Unit
from ralp_pipe.engine.sgd import FlatSgd, Optim, nbytes

Batch = tuple[torch.Tensor, torch.Tensor]


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
    bucket_mb: float = StrategyConfig.bucket_mb
    credit: int = StrategyConfig.credit
    pacer: Pacer | None = None  # time-dilated emulation (engine/dilation.py); None: no padding
    # the batch per worker and crop RALP's messages carry where a dilated run computes on less (None: the above)
    message_batch: int | None = None
    message_image: int | None = None
    variable_placement: str = StrategyConfig.variable_placement  # `dtf`: how its variables go to PS tasks
    variable_update: str = StrategyConfig.variable_update  # `dtf`: a host's GPUs summed before the push or not
    step_barrier: bool = StrategyConfig.step_barrier  # `dtf`: pulls only once every push of the step is applied

    def pace(self, modules: list[nn.Module], first: int, role: str) -> None:
        """Pad the forward and backward of `modules`, units `first`.. at `role`'s batch, where the run is dilated."""
        if self.pacer is not None:
            self.pacer.attach(modules, first, role)

    def update(self, params: list[torch.Tensor], step: Callable[[], Any]) -> None:
        """Run the SGD `step` of `params`, padded to the target's time where the run is dilated (modelled: only
        the wait)."""
        paced(self.pacer, lambda pacer: pacer.update_s(nbytes(params)), step)

    @property
    def message_size(self) -> tuple[int, int]:
        """The batch per worker and the crop the messages between workers and the PS device are sized for."""
        return self.message_batch or self.batch_size, self.message_image or self.image_size

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

    @property
    def modelled(self) -> bool:
        """Whether the run is dilated in mode modelled: its units compute nothing and produce no gradient."""
        return self.pacer is not None and not self.pacer.targets.computes

    def network(self) -> nn.Sequential:
        """The whole model as a Sequential of its units, on this rank's device."""
        return nn.Sequential(*(u.module for u in self.units)).to(self.device)

    def layout(self) -> list[tuple[str, torch.Tensor]]:
        """The model's named parameters where they are (on the meta device for a rank without a model)."""
        return list(nn.Sequential(*(u.module for u in self.units)).named_parameters())

    def autocast(self) -> torch.autocast:
        """Mixed precision (bfloat16) for forward passes when `amp` is set on a CUDA device."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp and self.device.type == "cuda")


@dataclass(frozen=True)
class Piece:
    """Elements ``[offset, offset + values.numel())`` of the flattened parameter `name` of shape `shape`."""

    name: str
    shape: tuple[int, ...]
    offset: int
    values: torch.Tensor

    @classmethod
    def whole(cls, name: str, tensor: torch.Tensor) -> "Piece":
        """All of `tensor`, as one piece."""
        return cls(name, tuple(tensor.shape), 0, tensor.detach().reshape(-1).clone())


def assemble(pieces: list[Piece]) -> dict[str, torch.Tensor]:
    """Whole parameters from the pieces the ranks hold; a gap or an element claimed twice is an error."""
    by_name: dict[str, list[Piece]] = {}
    for piece in pieces:
        by_name.setdefault(piece.name, []).append(piece)
    out = {}
    for name, parts in by_name.items():
        parts.sort(key=lambda piece: piece.offset)
        numel, end = int(torch.Size(parts[0].shape).numel()), 0
        for piece in parts:
            if piece.offset != end:
                raise ValueError(
                    f"{name}: elements {min(end, piece.offset)}..{max(end, piece.offset)} held by no rank or twice"
                )
            end += piece.values.numel()
        if end != numel:
            raise ValueError(f"{name}: the ranks hold {end} of its {numel} elements")
        out[name] = torch.cat([piece.values for piece in parts]).reshape(parts[0].shape)
    return out


class Strategy(ABC):
    """One synchronous SGD step of the global batch, as seen from one rank."""

    @abstractmethod
    def step(self, batch: Batch | None) -> None:
        """Run one training step; workers get their (images, labels), server ranks get None."""

    @abstractmethod
    def state(self) -> list[Piece]:
        """The parameter elements this rank holds authoritatively (:func:`assemble` joins all ranks')."""

    def finish(self) -> None:  # noqa: B027  (a hook with nothing to do for most strategies, not abstract)
        """Complete the transfers a step left in flight (called before a window edge and at the end)."""


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the batch (the loss every strategy minimises)."""
    return nn.functional.cross_entropy(logits.float(), labels)


@dataclass(frozen=True)
class Bucket:
    """One message each way between every worker and one server: elements [start, stop) of the flat layout."""

    start: int
    stop: int
    server: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter lies in the flat buffers: reverse model order, the order backward produces gradients."""

    sizes: tuple[int, ...]

    @property
    def order(self) -> list[int]:
        """Parameter indices in layout order."""
        return list(reversed(range(len(self.sizes))))

    def offsets(self) -> dict[int, int]:
        """First flat element of each parameter."""
        out, offset = {}, 0
        for index in self.order:
            out[index] = offset
            offset += self.sizes[index]
        return out

    def overlapping(self, bucket: Bucket) -> list[int]:
        """Parameters with elements inside `bucket`."""
        offsets = self.offsets()
        return [i for i in self.order if offsets[i] < bucket.stop and offsets[i] + self.sizes[i] > bucket.start]


def plan_buckets(sizes: list[int], servers: list[int], bucket_elems: int | None) -> list[Bucket]:
    """The buckets parameters of `sizes` elements travel in between workers and `servers`, in sending order.

    The flat layout (reverse model order, the order backward produces gradients) is cut into
    buckets of `bucket_elems` elements across parameter boundaries, as BytePS partitions tensors,
    and the buckets are spread over `servers` balanced by size (each to the least-loaded server,
    so consecutive buckets go to different servers and travel in parallel); no bucket exceeds a
    server's fair share, so a model smaller than a bucket per server still reaches all. 0: one bucket per
    parameter, each whole on one server (Distributed TensorFlow's variable placement,
    :func:`assign_to_ps`); None: the sequential layout, one contiguous near-equal range per server.
    """
    layout, total = FlatLayout(tuple(sizes)), sum(sizes)
    if bucket_elems == 0:
        owner, offsets = assign_to_ps(sizes, len(servers)), layout.offsets()
        return [Bucket(offsets[i], offsets[i] + sizes[i], servers[owner[i]]) for i in layout.order if sizes[i]]
    if bucket_elems is None:
        bounds = [total * k // len(servers) for k in range(len(servers) + 1)]
        return [Bucket(a, b, server) for a, b, server in zip(bounds, bounds[1:], servers) if b > a]
    size = max(1, min(bucket_elems, -(-total // len(servers))))
    cuts = [*range(0, total, size), total]
    spans = list(zip(cuts, cuts[1:]))
    owner = assign_to_ps([stop - start for start, stop in spans], len(servers))
    return [Bucket(start, stop, servers[o]) for (start, stop), o in zip(spans, owner)]


def bucket_elements(bucket_mb: float, element_size: int) -> int:
    """Elements in a bucket of `bucket_mb` megabytes (10^6 bytes, as BytePS sizes its partitions)."""
    return int(bucket_mb * 1e6) // element_size


def _bucket_values(
    named: Sequence[tuple[str, torch.Tensor]], layout: FlatLayout, offsets: dict[int, int], bucket: Bucket
) -> list[torch.Tensor]:
    """Views of the parameter elements `bucket` covers, in flat order (no copy of the whole model)."""
    views = []
    for i in layout.overlapping(bucket):
        values, offset = named[i][1].detach().reshape(-1), offsets[i]
        views.append(values[max(bucket.start - offset, 0) : min(bucket.stop - offset, values.numel())])
    return views


class PushPullServer:
    """A parameter server for the buckets sent to it: reduce each bucket's gradients, SGD, send it back.

    With `overlap`, a bucket is reduced, updated and sent back as soon as every worker's copy of
    it has arrived, so pulls leave while later pushes still arrive; without it the server waits
    for everything first (the sequential ablation). Receives are posted in bucket order, the
    order workers send in.

    With `credit` (overlap only: the workers' ``strategy.credit``, so no worker has more than `credit`
    of this server's buckets pushed and not yet pulled back, and none pushes a bucket `credit` places
    after the oldest one the server has not yet updated), the server posts a bucket's receives once the
    bucket `credit` places before it is updated, and the buckets share `credit` sets of receive buffers,
    where that is fewer elements than one set per bucket. Without it a server holds every worker's copy
    of all its gradients: VGG-11 on 21841 classes at N = 8, 7 GB against 0.13 GB with 4 MB buckets and a
    credit of 4 (0.03 GB with 1 MB buckets).

    With `initial_from` (a rank), `named` may be meta tensors: the server allocates only its
    buckets on `device` and receives their initial values from that worker
    (:meth:`PushPullClient.send_initial`), so it never holds the whole model.

    With `barrier` (overlap only; Distributed TensorFlow's step-end barrier), each bucket is still reduced and
    updated as soon as every copy has arrived, but none is sent back before all of this server's buckets, and
    those of every server of `servers`, are updated (TensorFlow's barrier is global: no worker reads a variable
    before every worker's pushes are applied everywhere), and then in forward order (the first layers' first, as
    TensorFlow's workers read the variables); the workers post their pulls after their last push
    (:class:`PushPullClient` with `barrier`). The servers meet through the first of them: each other server
    sends it a token once updated, and it answers every one once all have arrived.
    """

    def __init__(
        self,
        comm: Comm,
        named: Sequence[tuple[str, torch.Tensor]],
        buckets: list[Bucket],
        workers: list[int],
        optim: Optim,
        mean: bool,
        overlap: bool,
        initial_from: int | None = None,
        device: torch.device | None = None,
        pacer: Pacer | None = None,
        credit: int = 0,
        barrier: bool = False,
        servers: Sequence[int] = (),
    ):
        self.comm, self.workers, self.overlap, self.pacer = comm, workers, overlap, pacer
        self.barrier = barrier and overlap
        self.servers, self.device = sorted(servers), device
        layout = FlatLayout(tuple(p.numel() for _, p in named))
        offsets = layout.offsets()
        self.mine = [b for b in buckets if b.server == comm.rank]
        dtype = named[0][1].dtype
        sizes = [len(b) for b in self.mine]
        inboxes = receive_buffers(sizes, len(workers), credit if overlap else 0, dtype, device)
        self.buckets = [
            FlatSgd(
                [torch.empty(len(b), dtype=dtype, device=device)]
                if initial_from is not None
                else _bucket_values(named, layout, offsets, b),
                len(workers),
                optim,
                mean,
                inbox,
            )
            for b, inbox in zip(self.mine, inboxes)
        ]
        if initial_from is not None:
            self.comm.wait([self.comm.irecv(sgd.flat.data, initial_from) for sgd in self.buckets], counted=False)
        held = {i for b in self.mine for i in layout.overlapping(b)}
        self.params = [(named[i][0], tuple(named[i][1].shape), offsets[i]) for i in sorted(held)]
        # NCCL runs the operations between two ranks in posting order: a worker pushes g_b then
        # pulls p_b, so the server must receive g_b and send p_b before receiving g_b+1. Gloo
        # matches each direction on its own, so the receives of every bucket (or of `credit` buckets, where they
        # share buffers) are posted at once.
        shared = any(inbox is not None for inbox in inboxes)
        self.ahead = 1 if overlap and comm.ordered_p2p else credit if shared else len(self.buckets)
        self._pending: dict[int, list[Handle]] = {}

    def _receive(self, b: int) -> None:
        if b < len(self.buckets) and b not in self._pending:
            self._pending[b] = [self.comm.irecv(buf, w) for buf, w in zip(self.buckets[b].inbox, self.workers)]

    def post_receives(self) -> None:
        """Start receiving the workers' gradients: of as many buckets as may be in flight (:attr:`ahead`)."""
        for b in range(self.ahead):
            self._receive(b)

    def step(self) -> None:
        """Serve one step: receive, reduce, update and send back every bucket."""
        self.post_receives()
        sends: list[Handle] = []
        if self.overlap:
            for b, bucket in enumerate(self.buckets):
                self._receive(b)
                self.comm.wait(self._pending.pop(b))
                self._reduce_update(bucket)
                if not self.barrier:
                    sends += [self.comm.isend(bucket.flat.data, w, "parameters") for w in self.workers]
                self._receive(b + self.ahead)  # into the buffers this bucket has just freed, where they are shared
            if self.barrier:  # every bucket updated everywhere: send them back in the order the next forward needs them
                self._meet()
                sends = [
                    self.comm.isend(b.flat.data, w, "parameters") for b in reversed(self.buckets) for w in self.workers
                ]
        else:
            self.comm.wait([h for b in range(len(self.buckets)) for h in self._pending.pop(b)])
            for bucket in self.buckets:
                self._reduce_update(bucket)
            sends = [self.comm.isend(b.flat.data, w, "parameters") for b in self.buckets for w in self.workers]
        self.comm.wait(sends)

    def _meet(self) -> None:
        """Wait until every server of :attr:`servers` has updated its buckets (this one included): the others each
        send the first a token and wait for its answer, which it sends once it has them all."""
        others = [s for s in self.servers if s != self.comm.rank]
        if not others:
            return
        first = self.servers[0]
        tokens = [torch.zeros(1, device=self.device) for _ in others]
        if self.comm.rank == first:
            self.comm.wait([self.comm.irecv(token, s) for token, s in zip(tokens, others)])
            self.comm.wait([self.comm.isend(token, s, CONTROL) for token, s in zip(tokens, others)])
        else:
            self.comm.wait([self.comm.isend(tokens[0], first, CONTROL)])
            self.comm.wait([self.comm.irecv(tokens[0], first)])

    def _reduce_update(self, sgd: FlatSgd) -> None:
        """Reduce a bucket's gradient sets and update it, each padded to the target's time where dilated."""
        size = nbytes([sgd.flat])
        paced(self.pacer, lambda pacer: pacer.aggregate_s(size, len(sgd.inbox)), sgd.reduce)
        paced(self.pacer, lambda pacer: pacer.update_s(size), sgd.update)

    def state(self) -> list[Piece]:
        """The elements of the held buckets, as pieces of the parameters they belong to."""
        out = []
        for bucket, sgd in zip(self.mine, self.buckets):
            values = sgd.flat.detach()
            for name, shape, offset in self.params:
                numel = int(torch.Size(shape).numel())
                start, stop = max(offset, bucket.start), min(offset + numel, bucket.stop)
                if start < stop:
                    piece = values[start - bucket.start : stop - bucket.start].clone()
                    out.append(Piece(name, shape, start - offset, piece))
        return out


def shares_receive_buffers(sizes: list[int], credit: int) -> bool:
    """Whether a server of buckets of `sizes` elements shares `credit` sets of receive buffers among them
    (:class:`PushPullServer`): where that is fewer elements than one set per bucket."""
    return bool(credit) and credit * max(sizes, default=0) < sum(sizes)


def receive_elements(sizes: list[int], credit: int) -> int:
    """Elements of the receive buffers a server of buckets of `sizes` elements holds for one worker."""
    return credit * max(sizes) if shares_receive_buffers(sizes, credit) else sum(sizes)


def receive_buffers(
    sizes: list[int], sets: int, credit: int, dtype: torch.dtype, device: torch.device | None
) -> list[list[torch.Tensor] | None]:
    """Receive buffers of buckets of `sizes` elements, `sets` each: bucket i's in set i % `credit` of shared
    buffers where that holds fewer elements (:func:`shares_receive_buffers`); else a None each (each FlatSgd its
    own)."""
    if not shares_receive_buffers(sizes, credit):
        return [None] * len(sizes)
    shared = [[torch.empty(max(sizes), dtype=dtype, device=device) for _ in range(sets)] for _ in range(credit)]
    return [[buffer[:size] for buffer in shared[i % credit]] for i, size in enumerate(sizes)]


class PushPullClient:
    """A worker's side of the parameter servers: push gradient buckets, pull parameter buckets.

    The parameters and gradients are views into two flat buffers in the layout the buckets cut, so buckets
    go out and come in without copies (`modelled`, where no gradient exists: one buffer of a bucket). With
    `overlap`, the gradient hooks mark a bucket ready as soon as backward has produced every parameter in it
    (in bucket order), and a sender thread the step starts (BytePS's scheduler) pushes ready buckets in
    order, each with its pull posted right behind it; the next forward waits, layer by layer, only for the
    buckets holding the parameters it is about to use (:meth:`attach`). Without it, everything is pushed
    after backward, then pulled before the step returns.

    `credit` (BytePS's scheduling credit) caps, per server, the buckets pushed and not yet
    pulled back: the sender holds the next bucket for that server until its oldest pull has
    landed, while backward runs on. It keeps the workers within a few buckets of each other.
    Without it TCP lets one worker's pushes take the PS link while the server, needing every
    worker's copy of a bucket, has nothing to send back (measured: the PS's upload idle for a
    third of the step). The wait needs a thread: gloo's point-to-point work cannot be polled
    (``is_completed()`` stays False until waited for), and waiting in the gradient hook held
    backward (ResNet-50 `ps` at N = 2, V100 on 25 Gbit/s, dilated: 465 target images/s against 567
    without credit). The sender issues every push and pull of a backward, and
    :meth:`end_backward` returns only once it has issued all and ended, so the training loop and the
    sender never post at once: each pair of ranks sees its operations in one order, as NCCL needs.

    With `barrier` (overlap only; Distributed TensorFlow's step-end barrier), pulls are not posted behind the
    pushes: :meth:`end_backward` posts every bucket's pull after the last push, and the servers answer once all
    of the step's pushes are applied (:class:`PushPullServer` with `barrier`); the next forward waits for them
    layer by layer as before.

    With `token` (a modelled run's local worker of a host, whose server is the host's leader), each bucket's push
    and pull is a one-element token standing for the bucket, counted as its bytes: the transfer inside the host is
    priced and waited for by the leader (:class:`ralp_pipe.engine.strategies.ps.HostLeaderClient`), not copied.
    """

    def __init__(
        self,
        comm: Comm,
        params: Sequence[torch.Tensor],
        buckets: list[Bucket],
        overlap: bool,
        credit: int = 0,
        modelled: bool = False,
        token: bool = False,
        barrier: bool = False,
    ):
        self.comm, self.buckets, self.overlap, self.barrier = comm, buckets, overlap, barrier and overlap
        self.credit, self.modelled, self.token = credit, modelled, token
        layout = FlatLayout(tuple(p.numel() for p in params))
        offsets = layout.offsets()
        dtype, device = params[0].dtype, params[0].device
        if modelled:
            # no gradient exists (the units' are empty) and nothing is trained: every bucket leaves from and lands in
            # one zeroed buffer of the largest bucket's size (zeros pushed, summed and pulled back stay zeros); the
            # units' parameters keep their own storage, allocated uninitialised and never touched, so the worker
            # holds a bucket, not two copies of the model (N = 16 of VGG/22K fits), and moves the same bytes
            self.flat_params = self.flat_grads = torch.zeros(
                max((len(b) for b in buckets), default=0), dtype=dtype, device=device
            )
        else:
            self.flat_params = torch.empty(sum(layout.sizes), dtype=dtype, device=device)
            views = [slice(offsets[i], offsets[i] + p.numel()) for i, p in enumerate(params)]
            for view, p in zip(views, params):  # each parameter's own storage is freed as it moves into the flat one
                self.flat_params[view].copy_(p.detach().reshape(-1))
                p.data = self.flat_params[view].view_as(p)
            self.flat_grads = torch.zeros_like(self.flat_params)  # after: the worker holds at most two copies at once
            for view, p in zip(views, params):
                p.grad = self.flat_grads[view].view_as(p)
        self.buckets_of: dict[int, list[int]] = {id(p): [] for p in params}
        for b, bucket in enumerate(buckets):
            for index in layout.overlapping(bucket):
                self.buckets_of[id(params[index])].append(b)
        self._parts = [sum(b in self.buckets_of[id(p)] for p in params) for b in range(len(buckets))]
        self._left = list(self._parts)
        # shared with a step's sender thread, under `_state`: buckets backward has produced (in order), buckets
        # issued, the pushes of this step and the pulls not yet waited for; and what stopped the sender
        self._state = threading.Condition()
        self._ready = self._issued = 0
        self._sends: list[Handle] = []
        self._pulls: dict[int, Handle] = {}
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None
        if overlap:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_gradient)

    def send_initial(self) -> None:
        """Send every bucket's initial parameters to its server (for servers built with `initial_from`)."""
        sends = [self.comm.isend(self.span(b, self.flat_params), b.server, SETUP) for b in self.buckets]
        self.comm.wait(sends, counted=False)

    def attach(self, modules: list[nn.Module]) -> None:
        """Make each module's forward wait first for the pulls of the buckets holding its own parameters."""
        for module in modules:
            needed = sorted({b for p in module.parameters(recurse=False) for b in self.buckets_of.get(id(p), [])})
            if needed:
                module.register_forward_pre_hook(lambda _m, _x, needed=needed: self.wait_pulls(needed))

    def begin(self) -> None:
        """Start a step: the last step's pushes must have completed; zero the gradients; with overlap, start the
        step's sender thread."""
        sends, self._sends = self._sends, []
        self.comm.wait(sends)
        if not self.modelled:  # modelled: no gradient accumulates
            self.flat_grads.zero_()
        self._left = list(self._parts)
        self._ready = self._issued = 0
        if self.overlap:
            self._thread = threading.Thread(target=self._sender, name="push-scheduler", daemon=True)
            self._thread.start()

    def _on_gradient(self, param: torch.Tensor) -> None:
        for bucket in self.buckets_of[id(param)]:
            self._left[bucket] -= 1
        ready = self._ready
        while ready < len(self.buckets) and self._left[ready] == 0:
            ready += 1
        if ready > self._ready:
            self._release(ready)

    def _release(self, ready: int) -> None:
        """Hand buckets up to `ready` (exclusive) to the sender."""
        with self._state:
            self._ready = ready
            self._state.notify_all()

    def _sender(self) -> None:
        """A step's sender thread: issue each ready bucket in order once its server has credit, then end."""
        try:
            while self._issued < len(self.buckets):
                with self._state:
                    self._state.wait_for(lambda: self._issued < self._ready)
                    b = self._issued
                    held = self._held(b)
                self.comm.wait(list(held.values()), counted=False)  # backward runs on meanwhile
                push, pull = self._issue(b)
                with self._state:
                    for landed, handle in held.items():
                        if self._pulls.get(landed) is handle:
                            del self._pulls[landed]
                    self._sends.append(push)
                    if pull is not None:
                        self._pulls[b] = pull
                    self._issued = b + 1
                    self._state.notify_all()
        except BaseException as error:  # handed to the training loop, which raises it in end_backward
            self._failed = error

    def _held(self, b: int) -> dict[int, Handle]:
        """The pulls to land before bucket `b` may leave: its own from the last step, if no forward waited for it
        (a parameter it did not use: its buffer is about to be reused), and, where `credit` of its server's
        buckets are pushed and not yet pulled back, the oldest of them (0: no cap). Called under `_state`."""
        held = {b: self._pulls[b]} if b in self._pulls else {}
        server = self.buckets[b].server
        pending = sorted(p for p in self._pulls if self.buckets[p].server == server)
        if self.credit and len(pending) >= self.credit:
            held[pending[0]] = self._pulls[pending[0]]
        return held

    def _issue(self, b: int) -> tuple[Handle, Handle | None]:
        """Push bucket `b`; with overlap (no barrier), post its pull right behind (gloo tells the server "ready" with
        the data)."""
        bucket = self.buckets[b]
        push = self.comm.isend(
            self._wire(bucket, self.flat_grads), bucket.server, "gradients", self._stands_for(bucket)
        )
        behind = self.overlap and not self.barrier
        pull = self.comm.irecv(self._wire(bucket, self.flat_params), bucket.server) if behind else None
        return push, pull

    def _post_pulls(self) -> dict[int, Handle]:
        """With `barrier`: post every bucket's pull after the step's last push, in the order the next forward uses
        them (the servers send in that order), which waits for them layer by layer."""
        pulls = {
            b: self.comm.irecv(self._wire(self.buckets[b], self.flat_params), self.buckets[b].server)
            for b in reversed(range(len(self.buckets)))
        }
        with self._state:
            self._pulls.update(pulls)
        return pulls

    def span(self, bucket: Bucket, flat: torch.Tensor) -> torch.Tensor:
        """`bucket`'s elements of `flat` (the parameters or their gradients); modelled: the shared buffer's first."""
        return flat[: len(bucket)] if self.modelled else flat[bucket.start : bucket.stop]

    def _wire(self, bucket: Bucket, flat: torch.Tensor) -> torch.Tensor:
        """What crosses to `bucket`'s server: its span, or with `token` one element standing for it."""
        return self.span(bucket, flat)[:1] if self.token else self.span(bucket, flat)

    def _stands_for(self, bucket: Bucket) -> int | None:
        """The bytes a token push of `bucket` is counted as (None: no token, the tensor's own are)."""
        return len(bucket) * self.flat_grads.element_size() if self.token else None

    def end_backward(self) -> None:
        """Hand the sender what is left and wait until it has issued every bucket (the time counts as
        communication wait); without overlap push every bucket, then pull every bucket, waited for here."""
        if not self.overlap:
            self._sends = [self._issue(b)[0] for b in range(len(self.buckets))]
            pulls = [self.comm.irecv(self._wire(b, self.flat_params), b.server) for b in self.buckets]
            self.comm.wait([*pulls, *self._sends])
            self._sends = []
            return
        assert self._thread is not None, "begin() starts a step"
        began = time.perf_counter()
        self._release(len(self.buckets))
        self._thread.join()
        self.comm.add_wait(time.perf_counter() - began)
        if self._failed is not None:
            raise self._failed
        if self.barrier:
            self._post_pulls()

    def wait_pulls(self, buckets: "range | list[int]") -> None:
        """Block until the pulls of `buckets` (those still pending) have landed."""
        with self._state:
            pulls = [self._pulls.pop(b) for b in buckets if b in self._pulls]
        self.comm.wait(pulls)

    def finish(self) -> None:
        """Complete every outstanding transfer (end of a measured window, or before reading parameters)."""
        self.wait_pulls(range(len(self.buckets)))
        sends, self._sends = self._sends, []
        self.comm.wait(sends)
