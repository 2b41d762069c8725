"""The training backend's own traffic across an emulated cluster's hosts, against its links' payload rate.

A modelled time-dilated run moves real tensors through gloo. Besides the kernel's TCP work, which the
link check's plain streams load, gloo copies every message through its buffers (and in a ring all-reduce
adds each chunk it receives into its own): work on the same few cores that grows with the rate, so the
backend can fall short of the links at a factor D the streams pass (9 hosts at 10 Gbit/s on 2 cores:
the streams passed D = 4, where `allreduce` at N = 8 measured 20% below its D = 8 figure; 2 hosts at
25 Gbit/s: the streams passed D = 1, where RALP-H at N = 2 measured 38% below its prediction). One gloo
rank per host, all at once, sends float32 messages about as large as the runs' buckets back to back, in
one of two patterns (:data:`PATTERNS`):

- ``ring``: all-reduce across every host; the figure is the bus bandwidth (bytes x 2(n-1)/n over the
  time, as nccl-tests define it);
- ``star``: the parameter server's load: every other host pushes a message to host 0 while host 0 sends
  one to each, at once; the figure is what crossed host 0's link each way, (n-1) messages, over the time.

:func:`backend_efficiency` returns the figure over the links' payload rate: about 1 where the emulation
keeps up, less where this host's cores bind.
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

from ralp_pipe.contract.topology import LINK_PATTERNS, RING, STAR
from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.process import start_logged, supervise

PORT = 29533  # rank 0's rendezvous on host 0's own address, inside a fresh cluster
PATTERNS = LINK_PATTERNS  # an all-reduce ring; a parameter server's incast and fan-out (module doc)
SECONDS = 0.3  # about this long per repeat at the links' rate ...
MESSAGE_BYTES = (1 << 20, 25 << 20)  # ... within these bounds (the upper: DDP's bucket_cap_mb default)
WINDOW_S = 1.0  # back-to-back timed repeats (at least 3) last about this long at the links' rate
MIN_REPEATS = 3
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class BackendMeasurement:
    """`hosts` gloo ranks on links shaped to `rate` moving `message_bytes` messages in `pattern` `repeats` times
    back to back: seconds per repeat (their mean), the bytes per second that makes over one direction of the
    busiest link (`bytes_per_s`: the ring's bus bandwidth, the star's host-0 figure) and its ratio to the
    links' payload rate (`efficiency`). Single short repeats would mostly time TCP ramping up after the idle
    link."""

    hosts: int
    rate: str
    pattern: str
    message_bytes: int
    repeats: int
    seconds: float
    bytes_per_s: float
    efficiency: float


def link_bytes(pattern: str, hosts: int, size: int) -> float:
    """Bytes one repeat of `pattern` with messages of `size` moves over one direction of its busiest link."""
    if pattern == RING:
        return size * 2 * (hosts - 1) / hosts
    if pattern == STAR:
        return float(size * (hosts - 1))
    raise ValueError(f"unknown backend pattern {pattern!r}; use one of {', '.join(PATTERNS)}")


def message_bytes(pattern: str, hosts: int, payload_bytes_per_s: float) -> int:
    """Bytes of each message: about :data:`SECONDS` of `pattern`'s traffic at the links' payload rate, within
    :data:`MESSAGE_BYTES`, a whole number of float32 elements."""
    low, high = MESSAGE_BYTES
    size = SECONDS * payload_bytes_per_s / link_bytes(pattern, hosts, 1)
    return int(min(high, max(low, size))) // 4 * 4


def backend_efficiency(cluster: EmulatedCluster, payload_bytes_per_s: float, pattern: str) -> BackendMeasurement:
    """Run `pattern` across every host of `cluster` (at least 2), one gloo rank per host, and compare what
    crosses the busiest link each way with `payload_bytes_per_s`, what one direction of a link delivers."""
    hosts = cluster.hosts
    if hosts < 2:
        raise ValueError(f"the backend check needs at least 2 hosts, got {hosts}")
    size = message_bytes(pattern, hosts, payload_bytes_per_s)
    moved = link_bytes(pattern, hosts, size)
    repeats = max(MIN_REPEATS, math.ceil(WINDOW_S * payload_bytes_per_s / moved))
    procs, logs = [], []
    with tempfile.TemporaryDirectory(prefix="ralp-backend-") as scratch:
        for rank in range(hosts):
            argv = [
                *cluster.prefix(rank),
                sys.executable,
                "-m",
                "ralp_pipe.runtime.backendcheck",
                "--rank",
                str(rank),
                "--world",
                str(hosts),
                "--init",
                f"tcp://{cluster.address(0)}:{PORT}",
                "--pattern",
                pattern,
                "--bytes",
                str(size),
                "--repeats",
                str(repeats),
            ]
            logs.append(Path(scratch, f"rank{rank}.log"))
            procs.append(start_logged(argv, logs[-1], {**os.environ, **cluster.env(rank)}))
        try:
            supervise(procs, logs, TIMEOUT_S, "backend check rank")
        except RunFailure as exc:
            raise RunFailure(f"the link check's gloo {pattern} over {hosts} emulated hosts: {exc}") from None
        output = logs[0].read_text()
    seconds = next((json.loads(line)["seconds"] for line in output.splitlines() if line.startswith("{")), None)
    if seconds is None:
        raise RunFailure(f"the link check's gloo {pattern} printed no timing; rank 0's log ends:\n{output[-2000:]}")
    rate = moved / seconds
    return BackendMeasurement(hosts, cluster.rate, pattern, size, repeats, seconds, rate, rate / payload_bytes_per_s)


def _rank(rank: int, world: int, init: str, pattern: str, size: int, repeats: int) -> float | None:
    """One rank: an untimed repeat of `pattern`, then `repeats` timed ones back to back, started together; rank 0
    returns their mean seconds."""
    import torch  # the ranks only: the driver never loads torch for this
    import torch.distributed as dist

    torch.set_num_threads(1)  # as each rank of a run on shared cores
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    outgoing = torch.ones(size // 4, dtype=torch.float32)
    incoming = [torch.empty_like(outgoing) for _ in range(world - 1 if rank == 0 else 1)]

    def once() -> None:
        if pattern == RING:
            dist.all_reduce(outgoing)
            return
        peers = range(1, world) if rank == 0 else [0]  # star: host 0 receives from and sends to every other
        works = [dist.irecv(buf, peer) for buf, peer in zip(incoming, peers)]
        works += [dist.isend(outgoing, peer) for peer in peers]
        for work in works:
            assert work is not None  # every rank is in the default group
            work.wait()

    once()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    seconds = (time.perf_counter() - start) / repeats
    dist.barrier()
    dist.destroy_process_group()
    return seconds if rank == 0 else None


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="one rank of the link check's gloo traffic")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--pattern", choices=PATTERNS, required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    a = parser.parse_args(argv)
    seconds = _rank(a.rank, a.world, a.init, a.pattern, a.bytes, a.repeats)
    if seconds is not None:
        print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
