"""Horovod-style data parallelism: a ring all-reduce of the gradients over the N workers.

torch DDP buckets the gradients and overlaps their reduction with backward; its communication
hook sends every bucket through :meth:`ralp_pipe.engine.comm.Comm.all_reduce`, so the bytes are
counted. Buffers (BatchNorm statistics) stay per worker, as with `forward_sync_buffers=False`.
The step's communication wait is the time backward still runs after the last bucket was
handed to the all-reduce, i.e. the time spent waiting for outstanding reductions.
"""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ralp_pipe.engine.strategies.base import Batch, StepSetup, Strategy, loss_fn


class AllReduceStrategy(Strategy):
    """The `allreduce` strategy on one worker."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        self.net = setup.network()
        device_ids = [setup.device.index] if setup.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(
            self.net, device_ids=device_ids, process_group=setup.comm.group, forward_sync_buffers=False
        )
        self.ddp.register_comm_hook(None, self._hook)
        self.optimizer = setup.optim.sgd(list(self.net.parameters()))
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
        self.setup.comm.add_wait(time.perf_counter() - self.last_bucket_at)
        self.optimizer.step()

    def state(self) -> dict[str, torch.Tensor]:
        """Every worker holds the whole model; rank 0 reports it."""
        if self.setup.rank != self.setup.topology.workers[0]:
            return {}
        return {name: p.detach().clone() for name, p in self.net.named_parameters()}
