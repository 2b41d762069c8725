"""Parameter-server baseline: workers push all gradients and pull all parameters every step.

Parameters are spread over the PS ranks by size (:func:`ralp_pipe.engine.topology.assign_to_ps`);
each PS averages the workers' gradients of its shard, applies SGD and sends the shard back.
"""

from __future__ import annotations

import torch

from ralp_pipe.engine.topology import PS, assign_to_ps
from ralp_pipe.engine.strategies.base import Batch, ShardClient, ShardServer, StepSetup, Strategy, loss_fn


class ParameterServerStrategy(Strategy):
    """The `ps` strategy on one rank (worker or PS)."""

    def __init__(self, setup: StepSetup):
        self.setup = setup
        self.net = setup.network()
        named = list(self.net.named_parameters())
        owner = assign_to_ps([p.numel() for _, p in named], len(setup.topology.ps))
        self.server: ShardServer | None = None
        self.clients: list[ShardClient] = []
        if setup.role == PS:
            index = setup.topology.ps.index(setup.rank)
            mine = [item for item, o in zip(named, owner) if o == index]
            if mine:
                self.server = ShardServer(setup.comm, mine, setup.topology.workers, setup.optim, mean=True)
            del self.net
        else:
            for index, server in enumerate(setup.topology.ps):
                params = [p for (_, p), o in zip(named, owner) if o == index]
                if params:
                    self.clients.append(ShardClient(setup.comm, params, server))

    def step(self, batch: Batch | None) -> None:
        """Worker: forward/backward, push gradients, pull parameters. PS: serve its shard."""
        if self.setup.role == PS:
            if self.server is not None:
                self.server.step()
            return
        assert batch is not None, "a ps worker needs a batch"
        images, labels = batch
        for client in self.clients:
            client.zero_grad()
        with self.setup.autocast():
            logits = self.net(images)
        loss_fn(logits, labels).backward()
        handles = [h for client in self.clients for h in client.push()]
        self.setup.comm.wait(handles)

    def state(self) -> dict[str, torch.Tensor]:
        """A PS's shard; workers hold only copies."""
        return self.server.state() if self.server is not None else {}
