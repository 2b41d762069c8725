"""The bytes the comm layer counts per step equal the analytic volume exactly, for every strategy."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ralp_pipe.config.schema import StrategyConfig
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models, volume
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.strategies import Optim, StepSetup, build
from ralp_pipe.engine.strategies.base import bucket_elements, plan_buckets
from support.spawn import spawn_function

CLASSES, BATCH, SIZE, STEPS = 10, 2, 32, 2
# (strategy, gpus, num_ps, split): split None = the model's default
CASES = [
    ("ps", 2, 2, None),
    ("ps", 3, 1, None),
    ("allreduce", 3, 1, None),
    ("allreduce", 2, 1, None),
    ("ralp_h", 4, 1, None),
    ("ralp_n", 3, 1, None),
    ("ralp_n", 3, 1, 5),
]


def _units() -> list[models.Unit]:
    torch.manual_seed(0)
    return models.placement_units(models.build("resnet18", CLASSES))


def _split(units: list[models.Unit], split: int | None) -> int:
    return models.default_split(units) if split is None else split


def _rank(rank: int, world: int) -> dict[tuple, list[dict]]:
    groups = {k: dist.new_group(list(range(k))) for k in sorted({topology(s, g, p).world_size for s, g, p, _ in CASES})}
    counted = {}
    for case in CASES:
        strategy, gpus, num_ps, split = case
        topo = topology(strategy, gpus, num_ps)
        if rank < topo.world_size:
            units = _units()
            comm = Comm(rank, topo.world_size, "gloo", groups[topo.world_size])
            engine = build(
                StepSetup(
                    topo, comm, units, _split(units, split), Optim(0.01, 0.9, 0.0), torch.device("cpu"), BATCH, SIZE
                )
            )
            gen = torch.Generator().manual_seed(rank)
            steps = []
            for _ in range(STEPS):
                batch = (
                    torch.randn(BATCH, 3, SIZE, SIZE, generator=gen),
                    torch.randint(0, CLASSES, (BATCH,), generator=gen),
                )
                engine.step(batch if rank in topo.workers else None)
                traffic = comm.take()
                steps.append({"categories": traffic.bytes_by_category, "peers": traffic.bytes_by_peer})
            engine.finish()
            counted[case] = steps
        dist.barrier()
    return counted


@pytest.fixture(scope="module")
def counted() -> list[dict[tuple, list[dict]]]:
    """Per rank: for each case, the traffic counted in each step."""
    return spawn_function(_rank, max(topology(s, g, p).world_size for s, g, p, _ in CASES))


@pytest.mark.slow  # the `counted` fixture spawns gloo ranks and trains every case (~20 s)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_counted_bytes_per_step_equal_the_analytic_volume(case: tuple, counted: list) -> None:
    strategy, gpus, num_ps, split = case
    topo = topology(strategy, gpus, num_ps)
    units = _units()
    want = volume.step_bytes(strategy, units, _split(units, split), topo, BATCH, SIZE)
    assert want["total"] > 0
    for step in range(STEPS):
        got = {
            name: sum(counted[r][case][step]["categories"][name] for r in range(topo.world_size))
            for name in volume.CATEGORIES
        }
        assert got == {name: want[name] for name in volume.CATEGORIES}, f"step {step}"
        assert sum(got.values()) == want["total"]


@pytest.mark.slow  # uses the spawned `counted` fixture
def test_ps_workers_send_each_server_its_shard(counted: list) -> None:
    case = ("ps", 2, 2, None)
    params = [p.numel() for p in torch.nn.Sequential(*(u.module for u in _units())).parameters()]
    buckets = plan_buckets(params, [2, 3], bucket_elements(StrategyConfig().bucket_mb, 4))  # the default, float32
    shard = [4 * sum(len(b) for b in buckets if b.server == server) for server in (2, 3)]
    assert sum(shard) == 4 * sum(params)  # every parameter travels, once
    assert min(shard) > 0
    for worker in (0, 1):
        assert counted[worker][case][0]["peers"] == {2: shard[0], 3: shard[1]}
    for server, size in zip((2, 3), shard):
        assert counted[server][case][0]["peers"] == {0: size, 1: size}


@pytest.mark.slow  # uses the spawned `counted` fixture
def test_ring_all_reduce_sends_each_rank_its_schedule_share(counted: list) -> None:
    case = ("allreduce", 3, 1, None)
    per_rank = [counted[r][case][1]["categories"]["gradients"] for r in range(3)]
    params = sum(p.numel() for u in _units() for p in u.module.parameters())
    assert sum(per_rank) == 4 * 2 * 2 * params
    assert all(abs(b - 4 * 2 * 2 * params / 3) < 4 * 2 * 2 * 32 for b in per_rank)  # within a few elements per bucket
    assert [counted[r][case][1]["peers"].keys() for r in range(3)] == [{1}, {2}, {0}]


def test_ring_share_follows_the_chunk_schedule() -> None:
    assert volume.ring_chunks(10, 3) == [4, 3, 3]
    assert [volume.ring_send_elements(10, 3, r) for r in range(3)] == [14, 13, 13]
    assert volume.ring_send_elements(10, 1, 0) == 0
