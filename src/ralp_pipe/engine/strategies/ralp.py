"""RALP (`ralp_h`, `ralp_n`): workers run the lower layers, one PS device runs the upper ones.

Per step each worker runs units[:split] on its batch and sends the activations and labels to
the PS device, which concatenates them into the global batch, runs units[split:] and the loss,
updates the upper parameters locally and returns each worker its slice of the activation
gradients. Workers backpropagate the lower part and push its gradients to the PS device,
which also serves the lower parameters: it sums the workers' gradients (each already carries
the 1/global-batch factor of the loss), applies SGD and sends the parameters back. The result
equals SGD on the global batch (BatchNorm below the split is per worker, as in DDP).

The lower part travels through the same bucketed push/pull as `ps`: with overlap its buckets
leave during the workers' backward, the PS device receives them while it updates the upper
part, and returns each bucket as soon as every worker's copy has arrived.
"""

from __future__ import annotations

import math

import torch

from ralp_pipe.contract.topology import PS_DEVICE
from ralp_pipe.engine.dilation import PS_DEVICE_BATCH, WORKER
from ralp_pipe.engine.models import activation_shapes, check_split
from ralp_pipe.engine.strategies.base import Batch, Piece, PushPullClient, PushPullServer, StepSetup, Strategy, loss_fn


class LayerPlacementStrategy(Strategy):
    """The RALP strategies on one rank (worker or PS device)."""

    def __init__(self, setup: StepSetup):
        split = check_split(setup.split, len(setup.units))
        self.setup = setup
        self.server_rank = setup.topology.ps[0]
        batch, image = setup.message_size
        sample = activation_shapes(setup.units[:split], setup.image_size)[-1][1:]
        target = sample if image == setup.image_size else activation_shapes(setup.units[:split], image)[-1][1:]
        self.act_shape = (setup.batch_size, *sample)
        self.message_elements = max(batch * math.prod(target), math.prod(self.act_shape))
        self.message_labels = max(batch, setup.batch_size)
        net = setup.network()
        self.lower, self.upper = net[:split], net[split:]
        named = list(self.lower.named_parameters())
        buckets = setup.buckets([p.numel() for _, p in named], [self.server_rank], named[0][1].element_size())
        if setup.role == PS_DEVICE:
            workers = setup.topology.workers
            self.server = PushPullServer(
                setup.comm,
                named,
                buckets,
                workers,
                setup.optim,
                mean=False,
                overlap=setup.overlap,
                pacer=setup.pacer,
                credit=setup.credit,
            )
            self.upper_optimizer = setup.optim.sgd(list(self.upper.parameters()))
            setup.pace(list(self.upper), split, PS_DEVICE_BATCH)
            del self.lower
        else:
            self.client = PushPullClient(
                setup.comm, [p for _, p in named], buckets, setup.overlap, setup.credit, setup.modelled
            )
            self.client.attach(list(self.lower.modules()))
            setup.pace(list(self.lower), 0, WORKER)
            del self.upper

    def step(self, batch: Batch | None) -> None:
        """Run this rank's part of one RALP step."""
        if self.setup.role == PS_DEVICE:
            self._serve()
        else:
            assert batch is not None, "a RALP worker needs a batch"
            self._work(*batch)

    def _work(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        comm = self.setup.comm
        self.client.begin()
        with self.setup.autocast():
            activations = self.lower(images).float()
        grad = activations.new_empty(self.message_elements)
        comm.wait(
            [
                comm.isend(padded(activations, self.message_elements), self.server_rank, "activations"),
                comm.isend(padded(labels, self.message_labels), self.server_rank, "labels"),
                comm.irecv(grad, self.server_rank),
            ]
        )
        activations.backward(grad[: activations.numel()].view_as(activations))
        self.client.end_backward()

    def _serve(self) -> None:
        comm, device = self.setup.comm, self.setup.device
        workers = self.setup.topology.workers
        acts = [torch.empty(self.message_elements, device=device) for _ in workers]
        labels = [torch.empty(self.message_labels, dtype=torch.int64, device=device) for _ in workers]
        comm.wait([h for w, a, y in zip(workers, acts, labels) for h in (comm.irecv(a, w), comm.irecv(y, w))])
        batch, elements = self.act_shape[0], math.prod(self.act_shape)
        inputs = torch.cat([a[:elements].view(self.act_shape) for a in acts]).requires_grad_()
        self.upper.zero_grad(set_to_none=True)
        with self.setup.autocast():
            logits = self.upper(inputs)
        loss_fn(logits, torch.cat([y[:batch] for y in labels])).backward()
        assert inputs.grad is not None
        sends = [
            comm.isend(padded(g, self.message_elements), w, "activation_gradients")
            for g, w in zip(inputs.grad.split(batch), workers)
        ]
        self.server.post_receives()  # the lower part's gradients arrive while the upper part updates
        self.setup.update(list(self.upper.parameters()), self.upper_optimizer.step)
        comm.wait(sends)
        self.server.step()

    def finish(self) -> None:
        """Wait for the lower part's pulls still in flight (workers)."""
        if self.setup.role != PS_DEVICE:
            self.client.finish()

    def state(self) -> list[Piece]:
        """The PS device holds every parameter (lower as a PS, upper as its own layers)."""
        if self.setup.role != PS_DEVICE:
            return []
        return [*self.server.state(), *(Piece.whole(name, p) for name, p in self.upper.named_parameters())]


def padded(tensor: torch.Tensor, elements: int) -> torch.Tensor:
    """`tensor`'s elements first in a flat message of `elements` (the target's size where a dilated run computes on
    fewer images or a smaller crop; the rest is never read)."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == elements:
        return flat
    message = flat.new_empty(elements)
    message[: flat.numel()] = flat
    return message
