"""Parameter-server baseline, pipelined as Distributed TensorFlow and BytePS run it.

Every worker pushes all gradients and pulls all parameters every step, in buckets of about
``strategy.bucket_mb`` (:func:`ralp_pipe.engine.strategies.base.plan_buckets`) spread over the
PS ranks by size. A bucket leaves as soon as backward has produced it; each PS reduces,
updates and returns it as soon as every worker's copy has arrived; the next forward waits only
for the buckets of the layer it is about to run; a worker has at most ``strategy.credit``
buckets pushed and not yet pulled back. ``strategy.overlap=false`` is the sequential
ablation: push everything after backward, the PS waits for all of it, pull everything.
A PS rank never builds the model: it allocates its buckets and receives their initial values
from worker 0 before the first step, as Distributed TensorFlow's variables live on their PS.
"""

from __future__ import annotations

from ralp_pipe.contract.topology import PS, Topology
from ralp_pipe.engine.dilation import WORKER
from ralp_pipe.engine.strategies.base import (
    Batch,
    Bucket,
    Piece,
    PushPullClient,
    PushPullServer,
    StepSetup,
    Strategy,
    loss_fn,
)


def holds_model(topo: Topology, rank: int) -> bool:
    """Whether `rank` builds the whole model: every rank but a PS rank (role "ps"), which holds only its buckets,
    initialised from the first worker (VGG-11/21841, 4 PSes of one worker: 1315 instead of 1727 MiB each)."""
    return topo.role(rank) != PS


class ParameterServerStrategy(Strategy):
    """The `ps` strategy on one rank (worker or PS)."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        named = setup.layout()  # meta tensors on a PS rank (see holds_model)
        workers = setup.topology.workers
        buckets = self.server_buckets(setup, [p.numel() for _, p in named], named[0][1].element_size())
        self.server: PushPullServer | None = None
        self.client: PushPullClient | None = None
        if setup.role == PS:
            self.server = PushPullServer(
                setup.comm,
                named,
                buckets,
                workers,
                setup.optim,
                mean=True,
                overlap=setup.overlap,
                initial_from=workers[0],
                device=setup.device,
                pacer=setup.pacer,
                credit=setup.credit,
            )
        else:
            self.net = setup.network()
            params = [p for _, p in self.net.named_parameters()]
            self.client = PushPullClient(setup.comm, params, buckets, setup.overlap, setup.credit, setup.modelled)
            if setup.rank == workers[0]:
                self.client.send_initial()
            self.client.attach(list(self.net.modules()))
            setup.pace(list(self.net), 0, WORKER)

    @staticmethod
    def server_buckets(setup: StepSetup, sizes: list[int], element_size: int) -> list[Bucket]:
        """The buckets parameters of `sizes` elements travel in, spread over the PS ranks by size."""
        return setup.buckets(sizes, setup.topology.ps, element_size)

    def step(self, batch: Batch | None) -> None:
        """Worker: forward/backward, pushing and pulling buckets. PS: serve its buckets."""
        if self.server is not None:
            self.server.step()
            return
        assert batch is not None and self.client is not None, "a ps worker needs a batch"
        images, labels = batch
        self.client.begin()
        with self.setup.autocast():
            logits = self.net(images)
        loss_fn(logits, labels).backward()
        self.client.end_backward()

    def finish(self) -> None:
        """Wait for the pulls still in flight (workers)."""
        if self.client is not None:
            self.client.finish()

    def state(self) -> list[Piece]:
        """A PS's buckets; workers hold only copies."""
        return self.server.state() if self.server is not None else []
