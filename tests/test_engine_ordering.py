"""Point-to-point traffic between every pair of ranks is one mirrored sequence, as NCCL requires.

NCCL runs the sends and receives between two ranks strictly in the order each side posted
them, so a protocol is deadlock-free there only if, for every pair, one side's sequence of
operations towards the other is the other's sequence with send and receive swapped. The CPU
run below records every posted operation (gloo does not need the order, so the record is all
that is checked) with the communicator in its in-order mode, the one CUDA runs take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models
from ralp_pipe.engine.comm import Comm, Handle
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from support.spawn import spawn_function

pytestmark = pytest.mark.slow  # spawns ranks

CLASSES, BATCH, SIZE, STEPS = 5, 2, 32, 2
CASES = [("ps", 2, 1, True, 0.002), ("ps", 2, 2, True, 0.0), ("ps", 2, 1, False, 4.0), ("ralp_n", 3, 1, True, 0.0)]


@dataclass
class RecordingComm(Comm):
    """A communicator in NCCL's in-order mode that records (peer, operation, elements) of every post."""

    posted: list[tuple[int, str, int]] = field(default_factory=list)

    @property
    def ordered_p2p(self) -> bool:
        return True

    def isend(self, tensor: torch.Tensor, dst: int, category: str, stands_for: int | None = None) -> Handle:
        self.posted.append((dst, "send", tensor.numel()))
        return super().isend(tensor, dst, category, stands_for)

    def irecv(self, tensor: torch.Tensor, src: int) -> Handle:
        self.posted.append((src, "recv", tensor.numel()))
        return super().irecv(tensor, src)


def _units() -> list[models.Unit]:
    torch.manual_seed(0)
    return models.placement_units(models.build("resnet18", CLASSES))


def _rank(rank: int, world: int, case: tuple) -> list[tuple[int, str, int]]:
    strategy, gpus, num_ps, overlap, bucket_mb = case
    topo = topology(strategy, gpus, num_ps)
    units = _units()
    comm = RecordingComm(rank, world, "gloo")
    engine = build(
        StepSetup(
            topo,
            comm,
            units,
            models.default_split(units),
            Optim(0.01, 0.9, 0.0),
            torch.device("cpu"),
            BATCH,
            SIZE,
            overlap=overlap,
            bucket_mb=bucket_mb,
        )
    )
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        batch = (torch.randn(BATCH, 3, SIZE, SIZE, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen))
        engine.step(batch if rank in topo.workers else None)
    engine.finish()
    comm.barrier()
    return comm.posted


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c[0]}-n{c[1]}-ps{c[2]}-{'overlap' if c[3] else 'seq'}-{c[4]}MB"
)
def test_every_pair_posts_mirrored_sequences(case: tuple) -> None:
    world = topology(*case[:3]).world_size
    posted = spawn_function(_rank, world, (case,))
    swapped = {"send": "recv", "recv": "send"}
    pairs = 0
    for a in range(world):
        for b in range(a + 1, world):
            towards_b = [(op, n) for peer, op, n in posted[a] if peer == b]
            towards_a = [(swapped[op], n) for peer, op, n in posted[b] if peer == a]
            assert towards_b == towards_a, f"ranks {a} and {b} post their transfers in different orders"
            pairs += bool(towards_b)
    assert pairs >= topology(*case[:3]).num_workers  # every worker talks to a server
