"""The link probe: bandwidth and latency between two ranks where training's ranks talk, as a
:class:`~ralp_pipe.contract.records.LinkProbe`.

Two ranks (``python -m ralp_pipe.planning.link_probe``, started by :func:`measure_bandwidth`) time
gloo messages of ``message_bytes`` each way, the directions taking turns, and their all-reduce;
the link's rate is the slower direction's bytes over its time. The ranks run where training's
ranks would (:func:`probe_link`): two processes of this host (local), two hosts of an emulated
network shaped like `network.rate` (emulated), or two srun tasks on two nodes of the job's
allocation over the fabric's `network.interface` (slurm). ``ralp-pipe profile --link-only``
writes the record (:func:`link_record`); a compute profile carries one too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from ralp_pipe.config import cluster_kind
from ralp_pipe.config.units import rate_bytes_per_s
from ralp_pipe.contract.records import LinkProbe
from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime import hardware
from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.nodes import allocation_nodes
from ralp_pipe.runtime.process import free_port, start_logged, supervise

DEFAULT_MESSAGE_BYTES = 64 * 2**20


def measure_bandwidth(
    backend: str = "gloo",
    message_bytes: int = DEFAULT_MESSAGE_BYTES,
    repeats: int = 3,
    argv_prefixes: Sequence[Sequence[str]] = ((), ()),
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    rank_env: Sequence[Mapping[str, str]] = ({}, {}),
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Point-to-point bytes/s between two spawned ranks, both directions, and their all-reduce bus bytes/s.

    Rank r runs as ``[*argv_prefixes[r], python, -m, ralp_pipe.planning.link_probe, ...]`` with
    ``rank_env[r]`` added to its environment, so each rank can start inside its own network
    namespace (prefix ``ip netns exec NS``, env ``GLOO_SOCKET_IFNAME=eth0``) with rank 0
    listening on `master_addr`.
    """
    if len(argv_prefixes) != 2 or len(rank_env) != 2:
        raise ValueError("measure_bandwidth needs exactly two argv prefixes and two env mappings (ranks 0 and 1)")
    port = master_port or free_port()
    procs, logs = [], []
    with tempfile.TemporaryDirectory(prefix="ralp-probe-") as scratch:
        for rank in (0, 1):
            argv = [
                *argv_prefixes[rank],
                sys.executable,
                "-m",
                "ralp_pipe.planning.link_probe",
                "--rank",
                str(rank),
                "--init",
                f"tcp://{master_addr}:{port}",
                "--backend",
                backend,
                "--bytes",
                str(message_bytes),
                "--repeats",
                str(repeats),
                "--timeout",
                str(timeout_s),
            ]
            logs.append(Path(scratch, f"probe{rank}.log"))
            procs.append(start_logged(argv, logs[-1], {**os.environ, **rank_env[rank]}))
        try:
            supervise(procs, logs, timeout_s, "bandwidth probe rank")
        except RunFailure as exc:
            raise RunFailure(f"link probe between {master_addr}:{port} ({backend}): {exc}") from None
        output = logs[0].read_text()
    result = next(
        (json.loads(line) for line in reversed(output.splitlines()) if line.startswith("{") and '"directions"' in line),
        None,
    )
    if result is None:
        raise RunFailure(f"link probe rank 0 printed no result; its log ends:\n{output[-2000:]}")
    result["bytes_per_s"] = min(result["directions"].values())
    return result


def _bandwidth_rank(
    rank: int, init: str, backend: str, message_bytes: int, repeats: int, timeout_s: float
) -> dict[str, Any] | None:
    """One rank of the probe: timed sends + 1-element acknowledgements in both directions, then all-reduces."""
    hardware.keep_freed_memory()  # as training ranks run
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))
    message = torch.ones(message_bytes // 4, dtype=torch.float32)
    ack = torch.zeros(1)

    def round_trip(sender: int, payload: torch.Tensor) -> float:
        peer = 1 - rank
        start = time.perf_counter()
        if rank == sender:
            dist.send(payload, peer)
            dist.recv(ack, peer)
        else:
            dist.recv(payload, peer)
            dist.send(ack, peer)
        return time.perf_counter() - start

    def all_reduce() -> float:
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(message)
        return time.perf_counter() - start

    for sender in (0, 1):
        round_trip(sender, message)
    # Directions take turns, so drift of the host hits both alike. On this host's loopback single
    # 16 MiB messages ranged 2-5 GB/s with no pattern: a rate is all its messages' bytes over their
    # time (as iperf reports), never one message's or a median of few.
    seconds: dict[int, float] = {0: 0.0, 1: 0.0}
    for _ in range(repeats):
        for sender in (0, 1):
            seconds[sender] += round_trip(sender, message)
    latency = [round_trip(sender, torch.ones(1)) / 2 for _ in range(repeats) for sender in (0, 1)]
    directions = {f"{s}->{1 - s}": message_bytes * repeats / seconds[s] for s in (0, 1)}
    all_reduce()
    all_reduce_s = sum(all_reduce() for _ in range(repeats)) / repeats
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {
        "backend": backend,
        "message_bytes": message_bytes,
        "repeats": repeats,
        "directions": directions,
        "latency_s": statistics.median(latency),
        # bus bandwidth as nccl-tests define it: bytes * 2(n-1)/n / time, which is bytes / time at n=2
        "allreduce_bus_bytes_per_s": message_bytes / all_reduce_s,
    }


def probe_link(cfg: Any, message_bytes: int, repeats: int) -> dict[str, Any]:
    """The two-rank probe over the network `cfg` trains on.

    On an emulated cluster the ranks run on two hosts of one shaped like `cfg.network`; under
    SLURM they are two srun tasks, on the first two nodes of the job where it has two; elsewhere
    they are two processes of this host. The probe moves CPU tensors, so it uses gloo even where
    training would use NCCL.
    """
    kind = cluster_kind(cfg.cluster.kind)
    if kind.launcher == "srun":
        return _probe_fabric(cfg, message_bytes, repeats)
    if not kind.shapes_links:
        return {**measure_bandwidth("gloo", message_bytes, repeats), "network": "this host"}
    with EmulatedCluster(2, cfg.network.rate, cfg.network.burst) as cluster:
        result = measure_bandwidth(
            "gloo",
            message_bytes,
            repeats,
            argv_prefixes=(cluster.prefix(0), cluster.prefix(1)),
            master_addr=cluster.address(0),
            rank_env=(cluster.env(0), cluster.env(1)),
        )
    return {**result, "network": f"emulated {cfg.network.rate}"}


def _probe_fabric(cfg: Any, message_bytes: int, repeats: int) -> dict[str, Any]:
    """The probe between srun tasks of this job: nodes 0 and 1 where it has two, else both on its node."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        raise RunFailure(
            "cluster=slurm link probe outside a SLURM allocation (no SLURM_JOB_ID): "
            "submit it with sbatch/salloc or profile with cluster=local"
        )
    names = allocation_nodes(job)  # snakemake's jobstep executor strips SLURM_JOB_NODELIST
    nodes = min(2, len(names))
    srun = ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--export=ALL"]
    interface = cfg.network.interface
    env = {"GLOO_SOCKET_IFNAME": interface} if interface else {}
    result = measure_bandwidth(
        "gloo",
        message_bytes,
        repeats,
        argv_prefixes=tuple([*srun, f"--relative={rank % nodes}"] for rank in (0, 1)),
        master_addr=names[0],
        rank_env=(env, env),
    )
    return {**result, "network": f"fabric ({interface or 'interface routing to rank 0'}) across {nodes} node(s)"}


def link_record(cfg: Any, message_bytes: int, repeats: int, measure: bool = True) -> LinkProbe:
    """The link `cfg`'s ranks train over: measured by the probe (unless `measure` is false) and, where the
    cluster shapes its links, the configured rate."""
    shaped = cluster_kind(cfg.cluster.kind).shapes_links
    return LinkProbe(
        network=cfg.network.name,
        cluster_kind=cfg.cluster.kind,
        interface=cfg.network.interface,
        measured=probe_link(cfg, message_bytes, repeats) if measure else None,
        configured_rate=cfg.network.rate if shaped else None,
        configured_bytes_per_s=rate_bytes_per_s(cfg.network.rate) if shaped else None,
        hardware=hardware.describe(),
    )


def _rank_main(argv: Sequence[str]) -> int:
    """The entry of one probe rank: run it and, on rank 0, print the result as a JSON line."""
    parser = argparse.ArgumentParser(description="one rank of the bandwidth probe")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--bytes", type=int, default=DEFAULT_MESSAGE_BYTES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args(argv)
    result = _bandwidth_rank(a.rank, a.init, a.backend, a.bytes, a.repeats, a.timeout)
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
