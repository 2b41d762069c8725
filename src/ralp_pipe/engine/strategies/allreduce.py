"""Horovod-style data parallelism: a ring all-reduce of the gradients over the N workers.

torch DDP buckets the gradients and overlaps their reduction with backward; its communication
hook sends every bucket through :meth:`ralp_pipe.engine.comm.Comm.all_reduce`, so the bytes are
counted. Buffers (BatchNorm statistics) stay per worker, as with `forward_sync_buffers=False`.
The step's communication wait is the time backward still runs after the last bucket was
handed to the all-reduce, i.e. the time spent waiting for outstanding reductions.
With one worker (N=1, the single-device reference of the scaling plots) there is nothing to
reduce: the model trains unwrapped, without DDP's buckets, and the step has no communication.
In ``modelled`` dilation the units compute nothing and their gradients are empty (engine/dilation.py),
which DDP cannot take; :class:`ModelledBuckets` then all-reduces buffers of DDP's bucket sizes in DDP's
order instead, each as soon as backward has produced its last parameter: the first elements of one zeroed
buffer of the largest bucket's size (zeros summed stay zeros), so a worker holds that, not the model's size.
"""

import time
from typing import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.dilation import WORKER
from ralp_pipe.engine.strategies.base import Batch, Piece, StepSetup, Strategy, loss_fn

BUCKET_CAP_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default (its first bucket: dist._DEFAULT_FIRST_BUCKET_BYTES)


def ddp_buckets(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """DDP's gradient buckets of `params` as it rebuilds them after its first step: a first bucket of 1 MiB, then
    25 MiB, filled in the order backward produces the gradients (reverse model order)."""
    order = list(reversed(params))
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]
    buckets, _ = dist._compute_bucket_assignment_by_size(order, limits)
    return [[order[i] for i in bucket] for bucket in buckets]


class ModelledBuckets:
    """DDP's gradient buckets for parameters whose gradients are not computed: as DDP rebuilds them after its first
    step (a first bucket of 1 MiB, then 25 MiB, filled in the order backward produces the gradients: reverse model
    order), each all-reduced in bucket order once backward has produced all of its parameters' gradients."""

    def __init__(self, comm: Comm, params: list[torch.Tensor]):
        self.comm = comm
        buckets = ddp_buckets(params)
        sizes = [sum(p.numel() for p in bucket) for bucket in buckets]
        shared = torch.zeros(max(sizes, default=0), dtype=params[0].dtype)  # every bucket's: no gradient exists
        self.buffers = [shared[:size] for size in sizes]
        self.bucket_of = {id(p): k for k, bucket in enumerate(buckets) for p in bucket}
        self.sizes = [len(bucket) for bucket in buckets]
        self.left, self.last_bucket_at = list(self.sizes), 0.0
        self.futures: list[torch.futures.Future[list[torch.Tensor]]] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, param: torch.Tensor) -> None:
        self.left[self.bucket_of[id(param)]] -= 1
        while len(self.futures) < len(self.buffers) and self.left[len(self.futures)] == 0:
            self.futures.append(self.comm.all_reduce(self.buffers[len(self.futures)], "gradients"))
            self.last_bucket_at = time.perf_counter()

    def wait(self) -> None:
        """Wait for this step's all-reduces (counted as communication wait from the last bucket's start)."""
        for future in self.futures:
            future.wait()
        self.comm.add_wait(time.perf_counter() - self.last_bucket_at)
        self.left, self.futures = list(self.sizes), []


class AllReduceStrategy(Strategy):
    """The `allreduce` strategy on one worker."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        self.net = setup.network()
        self.single = setup.topology.num_workers == 1
        self.ddp: torch.nn.Module = self.net
        self.modelled: ModelledBuckets | None = None
        if not self.single and setup.pacer is not None and not setup.pacer.targets.computes:
            self.modelled = ModelledBuckets(setup.comm, list(self.net.parameters()))
        elif not self.single:
            device_ids = [setup.device.index] if setup.device.type == "cuda" else None
            ddp = DistributedDataParallel(
                self.net, device_ids=device_ids, process_group=setup.comm.group, forward_sync_buffers=False
            )
            ddp.register_comm_hook(None, self._hook)
            self.ddp = ddp
        self.optimizer = setup.optim.sgd(list(self.net.parameters()))
        setup.pace(list(self.net), 0, WORKER)
        self.last_bucket_at = 0.0

    def _hook(self, _state: None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer().div_(self.setup.topology.num_workers)
        self.last_bucket_at = time.perf_counter()
        future = self.setup.comm.all_reduce(tensor, "gradients")
        return future.then(lambda f: f.value()[0])

    def step(self, batch: Batch | None) -> None:
        """Forward/backward with overlapped gradient all-reduce, then SGD on the averaged gradients."""
        assert batch is not None, "an allreduce worker needs a batch"
        images, labels = batch
        self.optimizer.zero_grad(set_to_none=True)
        with self.setup.autocast():
            logits = self.ddp(images)
        loss_fn(logits, labels).backward()
        if self.modelled is not None:
            self.modelled.wait()
        elif not self.single:
            self.setup.comm.add_wait(time.perf_counter() - self.last_bucket_at)
        self.setup.update(list(self.net.parameters()), self.optimizer.step)

    def state(self) -> list[Piece]:
        """Every worker holds the whole model; rank 0 reports it."""
        if self.setup.rank != self.setup.topology.workers[0]:
            return []
        return [Piece.whole(name, p) for name, p in self.net.named_parameters()]
