"""All four strategies compute synchronous SGD on the global batch: same parameters after 3 steps,
with pipelined (bucketed, overlapped) and sequential parameter-server transfers alike.

One set of 4 spawned gloo ranks runs every case in turn (each case on a subgroup of the first
ranks), so the cost of starting processes is paid once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.strategies.base import Piece, assemble, loss_fn
from support.spawn import spawn_function

# the module fixture spawns 4 gloo ranks that run every case (> 3 min on 2 cores)
pytestmark = pytest.mark.slow

OPTIM = Optim(lr=0.01, momentum=0.9, weight_decay=1e-3)
CLASSES, STEPS, WORKERS = 5, 3, 2
# Without BatchNorm every strategy equals single-process SGD. A small VGG-shaped stack keeps
# the many no-BN cases fast; alexnet (the smallest torchvision CNN without BatchNorm; VGG-11
# needs ~2 GB per rank) checks the RALP path on a real model.
TINY = ("tiny_vgg", 32, 2)
NO_BN = ("alexnet", 64, 2)
BN = ("resnet18", 32, 8)


@dataclass(frozen=True)
class Case:
    strategy: str
    gpus: int
    num_ps: int
    model: str
    image_size: int
    batch: int
    overlap: bool = True
    bucket_mb: float = 4.0
    credit: int = 4

    @property
    def key(self) -> str:
        pipelining = f"overlap-{self.bucket_mb:g}MB-credit{self.credit}" if self.overlap else "sequential"
        return f"{self.strategy}-{self.gpus}-{self.num_ps}-{self.model}-{pipelining}"

    @property
    def world_size(self) -> int:
        return topology(self.strategy, self.gpus, self.num_ps).world_size


def _case(
    strategy: str,
    gpus: int,
    num_ps: int,
    spec: tuple[str, int, int],
    overlap: bool = True,
    bucket_mb: float = 4.0,
    credit: int = 4,
) -> Case:
    return Case(strategy, gpus, num_ps, *spec, overlap, bucket_mb, credit)


# Pipelined push/pull: sequential, one bucket per parameter (0 MB), buckets of a few
# parameters (0.002 MB = 500 floats: the tiny stack's tensors are 100s to 1000s of elements),
# 4 MB (one bucket for the tiny stack), over 1, 2 and 3 servers.
NO_BN_CASES = [
    _case(s, g, p, TINY, overlap, mb)
    for s, g, p, overlap, mb in [
        ("ps", 2, 1, False, 4.0),
        ("ps", 2, 1, True, 0.0),
        ("ps", 2, 2, True, 4.0),
        ("ps", 2, 3, True, 0.002),
        ("ps", 2, 3, False, 4.0),
        ("allreduce", 2, 1, True, 4.0),
        ("ralp_h", 4, 1, True, 0.002),
        ("ralp_n", 3, 1, False, 4.0),
        ("ralp_n", 3, 1, True, 0.0),
    ]
]
NO_BN_CASES.append(_case("ralp_n", 3, 1, NO_BN))
# credit 1 and 2: the servers' buckets share that many sets of receive buffers, each bucket's receives posted
# once the bucket that many places before it is updated
NO_BN_CASES += [_case("ps", 2, 1, TINY, True, 0.002, credit=1), _case("ralp_h", 4, 1, TINY, True, 0.002, credit=2)]
BN_CASES = [_case(s, g, 1, BN) for s, g in [("allreduce", 2), ("ps", 2), ("ralp_h", 4), ("ralp_n", 3)]]
BN_CASES += [_case("ps", 2, 1, BN, overlap=False), _case("ralp_n", 3, 1, BN, overlap=True, bucket_mb=0.0)]


def _data(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed global batches (WORKERS x batch images) for every step."""
    gen = torch.Generator().manual_seed(7)
    n, size = WORKERS * case.batch, case.image_size
    return [
        (torch.randn(n, 3, size, size, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen))
        for _ in range(STEPS)
    ]


def _tiny_vgg() -> list[models.Unit]:
    nn = torch.nn
    return [
        models.Unit("conv0", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())),
        models.Unit("pool0", nn.MaxPool2d(2)),
        models.Unit("conv1", nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())),
        models.Unit("avgpool", nn.AdaptiveAvgPool2d(4)),
        models.Unit("flatten", nn.Flatten(1)),
        models.Unit("fc0", nn.Sequential(nn.Linear(256, 64), nn.ReLU())),
        models.Unit("fc1", nn.Linear(64, CLASSES)),
    ]


def _units(model: str) -> list[models.Unit]:
    torch.manual_seed(0)
    if model == "tiny_vgg":
        return _tiny_vgg()
    return models.placement_units(models.build(model, CLASSES, dropout=0.0))


def _run_case(rank: int, case: Case, group: dist.ProcessGroup) -> list[Piece]:
    topo = topology(case.strategy, case.gpus, case.num_ps)
    assert topo.num_workers == WORKERS
    units = _units(case.model)
    comm = Comm(rank, topo.world_size, "gloo", group)
    setup = StepSetup(
        topo,
        comm,
        units,
        models.default_split(units),
        OPTIM,
        torch.device("cpu"),
        case.batch,
        case.image_size,
        overlap=case.overlap,
        bucket_mb=case.bucket_mb,
        credit=case.credit,
    )
    engine = build(setup)
    for images, labels in _data(case):
        part = slice(rank * case.batch, (rank + 1) * case.batch)
        engine.step((images[part], labels[part]) if rank in topo.workers else None)
    engine.finish()
    comm.barrier()
    return engine.state()


def _rank(rank: int, world: int, cases: list[Case]) -> dict[str, list[Piece]]:
    sizes = sorted({c.world_size for c in cases})
    groups = {k: dist.new_group(list(range(k))) for k in sizes}
    results = {}
    for case in cases:
        if rank < case.world_size:
            results[case.key] = _run_case(rank, case, groups[case.world_size])
        dist.barrier()
    return results


@pytest.fixture(scope="module")
def distributed() -> dict[str, dict[str, torch.Tensor]]:
    """Merged parameters of every case, by case key."""
    cases = NO_BN_CASES + BN_CASES
    per_rank = spawn_function(_rank, max(c.world_size for c in cases), (cases,))
    # assemble refuses an element held by two ranks or by none
    return {c.key: assemble([piece for results in per_rank for piece in results.get(c.key, [])]) for c in cases}


def _initial(model: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone() for n, p in torch.nn.Sequential(*(u.module for u in _units(model))).named_parameters()
    }


def _single_process(case: Case) -> dict[str, torch.Tensor]:
    net = torch.nn.Sequential(*(u.module for u in _units(case.model)))
    opt = OPTIM.sgd(list(net.parameters()))
    for images, labels in _data(case):
        opt.zero_grad()
        loss_fn(net(images), labels).backward()
        opt.step()
    return {name: p.detach() for name, p in net.named_parameters()}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
    """Every parameter trained and agrees within 1e-5 of the element or 2e-5 of the tensor's largest value (float rounding of differently ordered sums)."""
    assert got.keys() == want.keys()
    for name in want:
        assert not torch.equal(want[name], start[name]), f"{name} did not train"
        scale = want[name].abs().max().item()
        torch.testing.assert_close(
            got[name], want[name], rtol=1e-5, atol=2e-5 * scale, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize("case", NO_BN_CASES, ids=lambda c: c.key)
def test_strategy_equals_single_process_sgd_without_batchnorm(case: Case, distributed: dict) -> None:
    _assert_same(distributed[case.key], _single_process(case), _initial(case.model))


@pytest.mark.parametrize("case", BN_CASES[1:], ids=lambda c: c.key)
def test_strategy_equals_allreduce_with_batchnorm(case: Case, distributed: dict) -> None:
    _assert_same(distributed[case.key], distributed[BN_CASES[0].key], _initial(case.model))
