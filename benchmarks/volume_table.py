"""Measured GB/step of the four strategies next to the analytic figures (VGG-11, ResNet-50; 1K and 22K classes).

One training step per strategy through the real comm layer (spawned gloo ranks, 32x32 images,
batch 2: BatchNorm needs 2 values per channel), N=4 GPUs. The analytic column assumes the same
batch; measured must equal it.

    python benchmarks/volume_table.py [--models vgg11 resnet50] [--gpus 4] [--batch 2] [--size 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ralp_pipe.config import STRATEGIES, strategy_kind
from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models, volume
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.strategies import Optim, StepSetup, build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness shared with the tests
from support.spawn import spawn_function  # noqa: E402

MODELS = ("vgg11", "resnet50")
CLASSES = (1000, 21841)


def _rank(
    rank: int, world: int, model: str, classes: int, strategy: str, gpus: int, batch: int, size: int
) -> dict[str, int]:
    torch.manual_seed(0)
    units = models.placement_units(models.build(model, classes))
    topo = topology(strategy, gpus)
    comm = Comm(rank, world, "gloo")
    split = models.default_split(units) if strategy_kind(strategy).places_layers else None
    engine = build(StepSetup(topo, comm, units, split, Optim(0.01, 0.9, 0.0), torch.device("cpu"), batch, size))
    del units
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, classes, (batch,))
    engine.step((images, labels) if rank in topo.workers else None)
    dist.barrier()
    return comm.take().bytes_by_category


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
    print(f"N={args.gpus}, batch {args.batch}/worker, {args.size}x{args.size}; GB per step, all ranks' sends")
    print(
        f"{'model':<9} {'classes':>7} {'strategy':<9} {'measured':>10} {'analytic':>10} {'equal':>5}  split  by category (measured)"
    )
    for model in args.models:
        for classes in CLASSES:
            units = models.placement_units(models.build(model, classes))
            for strategy in STRATEGIES:
                topo = topology(strategy, args.gpus)
                split = models.default_split(units) if strategy_kind(strategy).places_layers else None
                want = volume.step_bytes(strategy, units, split, topo, args.batch, args.size)
                per_rank = spawn_function(
                    _rank, topo.world_size, (model, classes, strategy, args.gpus, args.batch, args.size), timeout_s=1800
                )
                got = {name: sum(r[name] for r in per_rank) for name in volume.CATEGORIES}
                total = sum(got.values())
                parts = ", ".join(f"{k} {v / 1e9:.4f}" for k, v in got.items() if v)
                print(
                    f"{model:<9} {classes:>7} {strategy:<9} {total / 1e9:>10.4f} {want['total'] / 1e9:>10.4f} "
                    f"{str(total == want['total']):>5}  {str(split):>5}  {parts}",
                    flush=True,
                )
            del units


if __name__ == "__main__":
    main()
