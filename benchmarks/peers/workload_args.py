"""The training workload both peer processes take on their command line (DDP ranks and TensorFlow tasks alike)."""

from __future__ import annotations

import argparse


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, classes, batch, image size, warm-up and measured steps, learning rate and threads."""
    parser.add_argument("--model", default="alexnet")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1)
