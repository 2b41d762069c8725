"""Which device and process-group backend the ranks of a run use, decided once for every stage."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch

from ralp_pipe.config import ClusterConfig, cluster_kind
from ralp_pipe.errors import ConfigError
from ralp_pipe.runtime.nodes import requests_gpus


def resolve_device(requested: str) -> str:
    """`cluster.device` as a device type: auto is cuda where torch sees a GPU, else cpu."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("cluster.device=cuda but no CUDA device is visible: use cluster.device=cpu or auto")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def ranks_per_host(cluster: ClusterConfig, world_size: int, hosts: Sequence[int] | None = None) -> int:
    """Ranks that share one host's GPUs: all of them on this host; under srun on GPU nodes those of the fullest node
    of the placement (`hosts`: each rank's node), which has as many GPUs as they use."""
    if cluster_kind(cluster.kind).launcher == "srun" and requests_gpus(cluster):
        return max(Counter(hosts).values()) if hosts else 1
    return world_size


def resolve_backend(requested: str, device: str, sharing: int) -> str:
    """`cluster.backend`: auto is NCCL only when each of the `sharing` ranks of a host has a GPU of its own."""
    if requested == "auto":
        return "nccl" if device == "cuda" and torch.cuda.device_count() >= sharing else "gloo"
    if requested == "nccl" and device != "cuda":
        raise ConfigError("cluster.backend=nccl needs CUDA devices: use cluster.backend=gloo or auto on CPU")
    return requested


def resolve(cluster: ClusterConfig, world_size: int, hosts: Sequence[int] | None = None) -> tuple[str, str]:
    """(device type, backend) of every rank of a `world_size`-rank run on `cluster` (`hosts`: each rank's host)."""
    device = resolve_device(cluster.device)
    return device, resolve_backend(cluster.backend, device, ranks_per_host(cluster, world_size, hosts))
