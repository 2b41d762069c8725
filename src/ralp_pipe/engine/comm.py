"""The one communication layer every strategy uses; it counts the bytes each rank sends.

Counting happens where tensors are sent: :meth:`Comm.isend` counts the tensor it sends (or the bytes a token
stands for, where a transfer inside an emulated host is priced instead of copied) and
:meth:`Comm.all_reduce` counts what this rank sends in a ring all-reduce
(:func:`ralp_pipe.engine.volume.ring_send_elements`). Ranks are numbered 0..world_size-1 in
`group` (None: the default group), which must hold the first world_size global ranks.
Bytes are kept per category and per peer until :meth:`Comm.take` hands them over (once per
training step). Time spent blocked in :meth:`Comm.wait` is the step's communication wait.
Setup traffic (a parameter server's initial buckets, once per run) belongs to no step: it is
sent under :data:`SETUP` and waited for with ``counted=False``, so neither its bytes nor its wait
are counted. A rank may issue and wait from two threads (a worker's push scheduler beside its
training loop): counting is locked, and a handle completes once, whichever thread waits first.

With gloo, point-to-point traffic of CUDA tensors is staged through host memory (gloo sends
host buffers only); NCCL sends device tensors directly.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

from ralp_pipe.engine.volume import CATEGORIES, ring_send_elements

SETUP = "setup"  # the category of traffic before the first step: sent, never counted
CONTROL = "control"  # a barrier's one-element tokens between servers: sent, never counted


@dataclass
class StepTraffic:
    """What one rank sent during one step: bytes by category and by destination, and its wait."""

    bytes_by_category: dict[str, int]
    bytes_by_peer: dict[int, int]
    comm_wait_s: float


@dataclass
class Handle:
    """A pending send or receive; a staged receive copies into its target when waited on."""

    work: dist.Work | None  # None: torch started nothing (it returns None for ranks outside the group)
    target: torch.Tensor | None = None
    staging: torch.Tensor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _done: bool = False

    def finish(self) -> None:
        """Block until the transfer is complete (and copy a staged receive into place). Waiting twice, or from
        two threads, returns once it is complete: gloo's work must be waited for exactly once."""
        with self._lock:
            if self._done:
                return
            if self.work is not None:
                self.work.wait()
            if self.target is not None and self.staging is not None:
                self.target.copy_(self.staging)
            self._done = True


@dataclass
class Comm:
    """Byte-counting point-to-point and collective operations of one rank."""

    rank: int
    world_size: int
    backend: str
    group: dist.ProcessGroup | None = None
    _bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _peers: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    _wait_s: float = 0.0
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _count(self, category: str, peer: int, nbytes: int) -> None:
        if category in (SETUP, CONTROL):
            return
        if category not in CATEGORIES:
            raise ValueError(f"unknown traffic category {category!r}; use one of {', '.join(CATEGORIES)}")
        with self._counting:
            self._bytes[category] += nbytes
            self._peers[peer] += nbytes

    @property
    def ordered_p2p(self) -> bool:
        """Whether point-to-point operations between two ranks run strictly in posting order (NCCL)."""
        return self.backend == "nccl"

    def _staged(self, tensor: torch.Tensor) -> bool:
        return self.backend == "gloo" and tensor.is_cuda

    def isend(self, tensor: torch.Tensor, dst: int, category: str, stands_for: int | None = None) -> Handle:
        """Start sending `tensor` to rank `dst`, counting its bytes under `category`; or, for a token sent in place of
        a transfer the emulation prices instead of copying (inside an emulated host), the `stands_for` bytes."""
        payload = tensor.detach().contiguous()
        if self._staged(payload):
            payload = payload.cpu()
        self._count(category, dst, payload.numel() * payload.element_size() if stands_for is None else stands_for)
        return Handle(dist.isend(payload, dst, group=self.group))

    def irecv(self, tensor: torch.Tensor, src: int) -> Handle:
        """Start receiving from rank `src` into `tensor` (complete once waited on)."""
        if self._staged(tensor):
            staging = torch.empty(tensor.shape, dtype=tensor.dtype)
            return Handle(dist.irecv(staging, src, group=self.group), target=tensor, staging=staging)
        return Handle(dist.irecv(tensor, src, group=self.group))

    def wait(self, handles: Sequence[Handle], counted: bool = True) -> None:
        """Block until every handle completes. With `counted` (call it from the training loop only), the time
        blocked counts as the step's communication wait; setup and a push scheduler's credit waits are not."""
        start = time.perf_counter()
        for handle in handles:
            handle.finish()
        if counted:
            self._wait_s += time.perf_counter() - start

    def all_reduce(self, tensor: torch.Tensor, category: str) -> torch.futures.Future[list[torch.Tensor]]:
        """Start a sum all-reduce of `tensor` over all ranks; count what this rank sends in a ring."""
        if self.world_size > 1:
            sent = ring_send_elements(tensor.numel(), self.world_size, self.rank) * tensor.element_size()
            self._count(category, (self.rank + 1) % self.world_size, sent)
        return dist.all_reduce(tensor, group=self.group, async_op=True).get_future()

    @property
    def wait_s(self) -> float:
        """Communication wait counted so far in this step (since the last :meth:`take`)."""
        return self._wait_s

    def add_wait(self, seconds: float) -> None:
        """Count `seconds` of communication wait measured outside :meth:`wait` (overlapped collectives)."""
        self._wait_s += seconds

    def barrier(self) -> None:
        """Synchronise all ranks (control traffic, not counted)."""
        dist.barrier(group=self.group)

    def take(self) -> StepTraffic:
        """Bytes and wait time since the last call, then start counting afresh."""
        with self._counting:
            traffic = StepTraffic(
                bytes_by_category={name: self._bytes.get(name, 0) for name in CATEGORIES},
                bytes_by_peer=dict(self._peers),
                comm_wait_s=self._wait_s,
            )
            self._bytes = defaultdict(int)
            self._peers = defaultdict(int)
        self._wait_s = 0.0
        return traffic
