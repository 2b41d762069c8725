"""One rank of plain PyTorch DistributedDataParallel (gloo), the all-reduce peer, run by path.

``python ddp_rank.py --rank R --world N --master ADDR:PORT [options]`` trains the project's
torchvision model (``ralp_pipe.engine.models.build``) with ``DistributedDataParallel`` and SGD with
momentum on a fixed synthetic batch: ``--warmup`` steps, a barrier, ``--steps`` measured steps, a
barrier, and prints one JSON line with the measured steps' times, losses and its host link's byte
counters at the window's edges. Nothing of ralp-pipe's engine runs: only torch's own DDP and gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from workload_args import add_workload_arguments  # the script's own folder is on sys.path

from ralp_pipe.engine import models
from ralp_pipe.runtime.wire import host_counters


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the rank it names."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="ADDR:PORT of rank 0's rendezvous")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=args.world)
    model = DistributedDataParallel(models.build(args.model, args.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(args.rank)
    images = torch.randn(args.batch, 3, args.size, args.size, generator=generator)
    labels = torch.randint(0, args.classes, (args.batch,), generator=generator)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    for _ in range(args.warmup):
        step()
    dist.barrier()
    before, began = host_counters(), time.perf_counter()
    times, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    dist.barrier()
    window, after = time.perf_counter() - began, host_counters()
    counters = [None if c is None else [c[1].tx_bytes, c[1].rx_bytes] for c in (before, after)]
    parameters = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {
                "task": args.rank,
                "window_s": window,
                "step_s": times,
                "loss": losses,
                "counters": counters,
                "parameters": parameters,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can hold a clean interpreter exit for seconds


if __name__ == "__main__":
    main(sys.argv[1:])
