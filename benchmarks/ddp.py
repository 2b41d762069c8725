"""Our `allreduce` strategy against a plain torch DDP loop: same model, batch and world size.

Both run in the same spawned gloo group, alternating measured windows so that shared-CPU
noise hits both alike. Prints each window's images/sec, the medians, their ratio and the
median ratio of adjacent windows (ours / plain; target >= 0.97).

    python benchmarks/ddp.py [--model resnet18] [--batch 16] [--size 32] [--world 2] [--steps 10] [--reps 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ralp_pipe.contract.topology import topology
from ralp_pipe.engine import models
from ralp_pipe.engine.comm import Comm
from ralp_pipe.engine.strategies import Optim, StepSetup, build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness shared with the tests
from support.spawn import spawn_function  # noqa: E402

OPTIM = Optim(lr=0.01, momentum=0.9, weight_decay=1e-4)


def _window(step: object, batch: tuple[torch.Tensor, torch.Tensor], steps: int) -> float:
    for _ in range(2):
        step(batch)  # warm-up
    dist.barrier()
    began = time.perf_counter()
    for _ in range(steps):
        step(batch)
    dist.barrier()
    return time.perf_counter() - began


def _rank(
    rank: int, world: int, model: str, batch_size: int, size: int, steps: int, reps: int
) -> dict[str, list[float]]:
    torch.manual_seed(0)
    ours_units = models.placement_units(models.build(model, 1000))
    ours = build(
        StepSetup(
            topology("allreduce", world),
            Comm(rank, world, "gloo"),
            ours_units,
            None,
            OPTIM,
            torch.device("cpu"),
            batch_size,
            size,
        )
    )
    torch.manual_seed(0)
    plain_model = DistributedDataParallel(models.build(model, 1000))
    plain_opt = OPTIM.sgd(list(plain_model.parameters()))

    def plain_step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        plain_opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(plain_model(images), labels).backward()
        plain_opt.step()

    gen = torch.Generator().manual_seed(rank)
    batch = (
        torch.randn(batch_size, 3, size, size, generator=gen),
        torch.randint(0, 1000, (batch_size,), generator=gen),
    )
    rates: dict[str, list[float]] = {"ours": [], "plain": []}
    for rep in range(reps):
        order = [("ours", ours.step), ("plain", plain_step)]
        for name, step in order if rep % 2 == 0 else order[::-1]:
            rates[name].append(world * batch_size * steps / _window(step, batch, steps))
    return rates


def main() -> None:
    """Measure and print both throughputs and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    rates = spawn_function(
        _rank,
        args.world,
        (args.model, args.batch, args.size, args.steps, args.reps),
        timeout_s=1800,
        threads=args.threads,
    )[0]
    print(
        f"{args.model} {args.size}x{args.size} batch {args.batch}/worker, {args.world} workers (gloo), "
        f"{args.steps} steps per window, windows alternated"
    )
    for name in ("ours", "plain"):
        print(f"  {name:>5} images/s per window: " + ", ".join(f"{r:.1f}" for r in rates[name]))
    ours, plain = statistics.median(rates["ours"]), statistics.median(rates["plain"])
    paired = statistics.median(o / p for o, p in zip(rates["ours"], rates["plain"]))
    print(f"  median images/s: allreduce (ours) {ours:.2f}  plain DDP {plain:.2f}  ratio {ours / plain:.3f}")
    print(f"  median ratio of adjacent windows (ours / plain): {paired:.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
