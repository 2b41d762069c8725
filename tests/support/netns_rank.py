"""A rank that joins a gloo group, all-reduces a one and writes where it ran (launcher tests)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main(argv: list[str]) -> int:
    """Write ``host master_addr sum netns`` to ``argv[0]/RANK``."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    total = torch.ones(1)
    dist.all_reduce(total)
    netns = os.readlink("/proc/self/ns/net")
    line = f"{os.environ['RALP_PIPE_HOST']} {os.environ['MASTER_ADDR']} {int(total)} {netns}"
    (Path(argv[0]) / os.environ["RANK"]).write_text(line)
    dist.destroy_process_group()
    return 0
