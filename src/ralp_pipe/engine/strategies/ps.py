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

Hosts of several GPUs (workers sharing a host in the topology, :func:`ralp_pipe.contract.topology.on_hosts`):
as BytePS runs, the workers of one host sum their gradients inside it before one push per host
(:func:`ralp_pipe.engine.volume.host_groups`): each other worker of the host (a local) pushes its buckets to the host's first worker
(its leader) and pulls them back from it; the leader adds its locals' copies of a bucket into its own, scales
the sum so that the servers' mean over the hosts is the mean over all workers, pushes it to the bucket's PS,
and relays the bucket's pull to its locals as soon as it lands (:class:`HostLeaderClient`). The servers
serve the leaders only. Inside a host the traffic takes the host's own route (an emulated host's loopback),
so each host's link carries one push and one pull of every bucket, the bytes the cost model prices.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

import torch

from ralp_pipe.contract.topology import PS, Topology
from ralp_pipe.engine.comm import Comm, Handle
from ralp_pipe.engine.dilation import WORKER, wait_until
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
from ralp_pipe.engine.volume import host_groups
from ralp_pipe.errors import RunFailure


def holds_model(topo: Topology, rank: int) -> bool:
    """Whether `rank` builds the whole model: every rank but a PS rank (role "ps"), which holds only its buckets,
    initialised from the first worker (VGG-11/21841, 4 PSes of one worker: 1315 instead of 1727 MiB each)."""
    return topo.role(rank) != PS


class HostLeaderClient(PushPullClient):
    """The first worker of a host of several: a :class:`PushPullClient` whose push of a bucket carries the sum of
    its host's copies, and which relays each pulled bucket to its host's other workers (`locals_`).

    Before pushing a bucket it receives the locals' copies (they push it to this rank as their server) and adds
    them into its own, scaled by `scale` (the pushing hosts over all workers: the servers average over the hosts).
    A relay thread sends each bucket's parameters to the locals once its pull has landed, in bucket order, while
    the training loop runs on (:meth:`finish` waits for it).

    With `in_host_s` (a modelled run, whose buckets hold no gradient), the transfers inside the host are priced,
    not copied: each local sends a one-element token for its copy (``PushPullClient(token=True)``), and once every
    local's has arrived the leader waits `in_host_s(bucket bytes)`, the interconnect's time for the host's sum as
    the cost model prices it (:meth:`ralp_pipe.contract.topology.Hosts.in_host_s`, x D), before the push; after
    the pull, it waits as long again before the token that hands the bucket to the locals. This machine's
    loopback then neither slows nor speeds the host's sums (metrics.json ``intra_host`` says which route ran).
    """

    def __init__(
        self,
        comm: Comm,
        params: Sequence[torch.Tensor],
        buckets: list[Bucket],
        overlap: bool,
        credit: int,
        locals_: list[int],
        scale: float,
        modelled: bool = False,
        in_host_s: Callable[[int], float] | None = None,
        barrier: bool = False,
    ):
        if comm.ordered_p2p:
            raise RunFailure(
                f"summing a host's gradients runs its transfers from two threads, which {comm.backend} would have to "
                f"see in one order: run hosts of several GPUs with gloo"
            )
        super().__init__(comm, params, buckets, overlap, credit, modelled, barrier=barrier)
        self.locals, self.scale, self.in_host_s = locals_, scale, in_host_s
        largest = 1 if in_host_s is not None else max((len(b) for b in buckets), default=0)
        self._inbox = [
            torch.empty(largest, dtype=self.flat_params.dtype, device=self.flat_params.device) for _ in locals_
        ]
        self._relays: queue.Queue[tuple[int, Handle | None]] = queue.Queue()
        self._relay_failed: BaseException | None = None
        threading.Thread(target=self._relay, name="host-relay", daemon=True).start()

    def _issue(self, b: int) -> tuple[Handle, Handle | None]:
        """Sum the host's copies of bucket `b` into this worker's, push it, and queue its pull for the locals."""
        bucket = self.buckets[b]
        copies = [inbox[: len(bucket)] for inbox in self._inbox]
        self.comm.wait([self.comm.irecv(copy, local) for copy, local in zip(copies, self.locals)], counted=False)
        self._priced_wait(bucket)
        if not self.modelled:  # modelled: no gradient exists, so nothing is summed (the same bytes move)
            grads = self.span(bucket, self.flat_grads)
            for copy in copies:
                grads.add_(copy)
            grads.mul_(self.scale)
        push, pull = super()._issue(b)
        if pull is not None:
            self._relays.put((b, pull))
        return push, pull

    def _post_pulls(self) -> dict[int, Handle]:
        """As :meth:`PushPullClient._post_pulls`, each pull queued for the locals."""
        pulls = super()._post_pulls()
        for b, pull in pulls.items():
            self._relays.put((b, pull))
        return pulls

    def _relay(self) -> None:
        """The relay thread: for each queued bucket, once its pull has landed, send it to every local."""
        while True:
            b, pull = self._relays.get()
            try:
                if pull is not None:
                    self.comm.wait([pull], counted=False)
                bucket = self.buckets[b]
                values, stands_for = self.span(bucket, self.flat_params), None
                if self.in_host_s is not None:
                    self._priced_wait(bucket)
                    values, stands_for = values[:1], len(bucket) * values.element_size()
                sends = [self.comm.isend(values, local, "parameters", stands_for) for local in self.locals]
                self.comm.wait(sends, counted=False)
            except BaseException as error:  # raised by the training loop in finish()
                self._relay_failed = error
            finally:
                self._relays.task_done()

    def _priced_wait(self, bucket: Bucket) -> None:
        """Where the host's transfers are priced: wait the interconnect's time for `bucket`, from now."""
        if self.in_host_s is not None:
            wait_until(time.perf_counter() + self.in_host_s(len(bucket) * self.flat_params.element_size()))

    def end_backward(self) -> None:
        """As :meth:`PushPullClient.end_backward`; without overlap, then send every pulled bucket to the locals."""
        super().end_backward()
        if not self.overlap:
            for b in range(len(self.buckets)):
                self._relays.put((b, None))
            self._wait_relays()

    def _wait_relays(self) -> None:
        began = time.perf_counter()
        self._relays.join()
        self.comm.add_wait(time.perf_counter() - began)
        if self._relay_failed is not None:
            raise self._relay_failed

    def finish(self) -> None:
        """Complete every outstanding transfer, the relays to the locals included."""
        super().finish()
        self._wait_relays()


class ParameterServerStrategy(Strategy):
    """The `ps` strategy on one rank (worker or PS)."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        named = setup.layout()  # meta tensors on a PS rank (see holds_model)
        workers = setup.topology.workers
        buckets = self.server_buckets(setup, [p.numel() for _, p in named], named[0][1].element_size())
        groups = host_groups(setup.topology) if self.sums_in_host(setup) else [[w] for w in workers]
        pushers = [group[0] for group in groups]
        self.server: PushPullServer | None = None
        self.client: PushPullClient | None = None
        if setup.role == PS:
            self.server = PushPullServer(
                setup.comm,
                named,
                buckets,
                pushers,
                setup.optim,
                mean=True,
                overlap=setup.overlap,
                initial_from=workers[0],
                device=setup.device,
                pacer=setup.pacer,
                credit=setup.credit,
                barrier=setup.step_barrier,
                servers=setup.topology.ps,
            )
        else:
            self.net = setup.network()
            params = [p for _, p in self.net.named_parameters()]
            [group] = [g for g in groups if setup.rank in g]
            priced = setup.pacer.in_host_s if setup.modelled and setup.pacer is not None else None
            if setup.rank != group[0]:  # a local: its host's leader is the server of every bucket
                local = [replace(bucket, server=group[0]) for bucket in buckets]
                self.client = PushPullClient(
                    setup.comm,
                    params,
                    local,
                    setup.overlap,
                    setup.credit,
                    setup.modelled,
                    token=priced is not None,
                    barrier=setup.step_barrier,
                )
            elif len(group) > 1:
                scale = len(pushers) / len(workers)
                self.client = HostLeaderClient(
                    setup.comm,
                    params,
                    buckets,
                    setup.overlap,
                    setup.credit,
                    group[1:],
                    scale,
                    setup.modelled,
                    priced,
                    barrier=setup.step_barrier,
                )
            else:
                self.client = PushPullClient(
                    setup.comm, params, buckets, setup.overlap, setup.credit, setup.modelled, barrier=setup.step_barrier
                )
            if setup.rank == workers[0]:
                self.client.send_initial()
            self.client.attach(list(self.net.modules()))
            setup.pace(list(self.net), 0, WORKER)

    @staticmethod
    def sums_in_host(setup: StepSetup) -> bool:
        """Whether the workers of a host sum their gradients before one push per host (BytePS: always)."""
        return True

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
