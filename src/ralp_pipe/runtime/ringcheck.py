"""The training backend's all-reduce across an emulated cluster's hosts, against its links' payload rate.

A modelled time-dilated ``allreduce`` run moves real gradients through gloo's ring all-reduce. Besides
the kernel's TCP work, which the link check's plain streams load, every rank adds each chunk it
receives into its own and copies the sums on: work on the same few cores that grows with the rate,
so the ring can fall short of the links at a factor D the streams pass (9 hosts at 10 Gbit/s on 2
cores: the streams passed D = 4, where `allreduce` at N = 8 measured 20% below its D = 8 figure).
:func:`ring_efficiency` runs one gloo rank per host, all at once, all-reducing float32 messages about
as large as DDP's buckets, and returns their bus bandwidth (bytes x 2(n-1)/n over the time, as
nccl-tests define it) over the links' payload rate: about 1 where the emulation keeps up, less where
this host's cores bind.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Sequence

from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.process import start_logged, supervise

PORT = 29533  # rank 0's rendezvous on host 0's own address, inside a fresh cluster
SECONDS = 0.3  # about this long per all-reduce at the links' rate ...
MESSAGE_BYTES = (1 << 20, 25 << 20)  # ... within these bounds (the upper: DDP's bucket_cap_mb default)
WINDOW_S = 1.0  # back-to-back timed all-reduces (at least 3) last about this long at the links' rate
MIN_REPEATS = 3
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RingMeasurement:
    """`hosts` gloo ranks on links shaped to `rate` all-reducing `message_bytes` `repeats` times back to back:
    seconds per all-reduce (their mean), the bus bandwidth that makes and its ratio to the links' payload rate
    (`efficiency`). Single short all-reduces would mostly time TCP ramping up after the idle link."""

    hosts: int
    rate: str
    message_bytes: int
    repeats: int
    seconds: float
    bus_bytes_per_s: float
    efficiency: float


def message_bytes(hosts: int, payload_bytes_per_s: float) -> int:
    """Bytes of each message: about :data:`SECONDS` of ring traffic at the links' payload rate, within
    :data:`MESSAGE_BYTES`, a whole number of float32 elements."""
    low, high = MESSAGE_BYTES
    size = SECONDS * payload_bytes_per_s * hosts / (2 * (hosts - 1))
    return int(min(high, max(low, size))) // 4 * 4


def ring_efficiency(cluster: EmulatedCluster, payload_bytes_per_s: float) -> RingMeasurement:
    """All-reduce across every host of `cluster` (at least 2), one gloo rank per host, and compare the bus
    bandwidth with `payload_bytes_per_s`, what one direction of a host's link delivers."""
    hosts = cluster.hosts
    if hosts < 2:
        raise ValueError(f"a ring needs at least 2 hosts, got {hosts}")
    size = message_bytes(hosts, payload_bytes_per_s)
    bus_bytes = size * 2 * (hosts - 1) / hosts  # one all-reduce's bytes over each link, each direction
    repeats = max(MIN_REPEATS, math.ceil(WINDOW_S * payload_bytes_per_s / bus_bytes))
    procs, logs = [], []
    with tempfile.TemporaryDirectory(prefix="ralp-ring-") as scratch:
        for rank in range(hosts):
            argv = [
                *cluster.prefix(rank),
                sys.executable,
                "-m",
                "ralp_pipe.runtime.ringcheck",
                "--rank",
                str(rank),
                "--world",
                str(hosts),
                "--init",
                f"tcp://{cluster.address(0)}:{PORT}",
                "--bytes",
                str(size),
                "--repeats",
                str(repeats),
            ]
            logs.append(Path(scratch, f"ring{rank}.log"))
            procs.append(start_logged(argv, logs[-1], {**os.environ, **cluster.env(rank)}))
        try:
            supervise(procs, logs, TIMEOUT_S, "ring check rank")
        except RunFailure as exc:
            raise RunFailure(f"the link check's all-reduce ring over {hosts} emulated hosts: {exc}") from None
        output = logs[0].read_text()
    seconds = next((json.loads(line)["seconds"] for line in output.splitlines() if line.startswith("{")), None)
    if seconds is None:
        raise RunFailure(f"the link check's all-reduce ring printed no timing; rank 0's log ends:\n{output[-2000:]}")
    bus = bus_bytes / seconds
    return RingMeasurement(hosts, cluster.rate, size, repeats, seconds, bus, bus / payload_bytes_per_s)


def _rank(rank: int, world: int, init: str, size: int, repeats: int) -> float | None:
    """One rank: an untimed all-reduce, then `repeats` timed ones back to back, started together; rank 0 returns
    their mean seconds."""
    import torch  # the ranks only: the driver never loads torch for this
    import torch.distributed as dist

    torch.set_num_threads(1)  # as each rank of a run on shared cores
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    message = torch.ones(size // 4, dtype=torch.float32)
    dist.all_reduce(message)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(message)
    seconds = (time.perf_counter() - start) / repeats
    dist.barrier()
    dist.destroy_process_group()
    return seconds if rank == 0 else None


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="one rank of the link check's all-reduce ring")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    a = parser.parse_args(argv)
    seconds = _rank(a.rank, a.world, a.init, a.bytes, a.repeats)
    if seconds is not None:
        print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
