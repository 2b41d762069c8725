"""Horovod-style data parallelism: a ring all-reduce of the gradients over the N workers.

torch DDP buckets the gradients and overlaps their reduction with backward; its communication
hook sends every bucket through :meth:`ralp_pipe.engine.comm.Comm.all_reduce`, so the bytes are
counted. Buffers (BatchNorm statistics) stay per worker, as with `forward_sync_buffers=False`.
The step's communication wait is the time backward still runs after the last bucket was
handed to the all-reduce, i.e. the time spent waiting for outstanding reductions.
With one worker (N=1, the single-device reference of the scaling plots) there is nothing to
reduce: the model trains unwrapped, without DDP's buckets, and the step has no communication.
"""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ralp_pipe.engine.dilation import WORKER
from ralp_pipe.engine.strategies.base import Batch, Piece, StepSetup, Strategy, loss_fn


class AllReduceStrategy(Strategy):
    """The `allreduce` strategy on one worker."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        self.net = setup.network()
        self.single = setup.topology.num_workers == 1
        self.ddp: torch.nn.Module = self.net
        if not self.single:
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
        if not self.single:
            self.setup.comm.add_wait(time.perf_counter() - self.last_bucket_at)
        with self.setup.padded_update(list(self.net.parameters())):
            self.optimizer.step()

    def state(self) -> list[Piece]:
        """Every worker holds the whole model; rank 0 reports it."""
        if self.setup.rank != self.setup.topology.workers[0]:
            return []
        return [Piece.whole(name, p) for name, p in self.net.named_parameters()]
