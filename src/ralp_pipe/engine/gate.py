"""Where the jobs of one concurrent workload meet, so that every step they measure ran with all of them loading the
shared link.

Jobs started at once do not reach their measured steps at once (start-up, warm-up and step lengths differ), and one
that finishes first leaves the others' last steps alone on the link: with a few measured steps the share of a window
that really ran together varies from round to round. The concurrent stage therefore gives every job of a workload one
folder (``train.gate``) and their number (``train.gate_jobs``):

- **start**: each job, its warm-up done and its transfers landed, checks in and starts its window only once every job
  has (:meth:`Gate.meet`);
- **end**: each job, its window closed, checks out and keeps stepping, unmeasured, until every job has checked out
  (:meth:`Gate.all_out`), so the link stays as loaded as in the window until the slowest job's ends.

Rank 0 of a job reads and writes the folder (its ranks may be on other hosts' namespaces but share its filesystem);
its other ranks follow through a process group of the gate's own, apart from the strategies' traffic.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from ralp_pipe.errors import RunFailure

POLL_S = 0.01  # how often rank 0 looks at the folder while it waits


@dataclass
class Gate:
    """One job's side of the meeting: `folder` shared by the workload's `jobs` jobs, waits bounded by `timeout_s`."""

    folder: Path
    jobs: int
    timeout_s: float
    rank: int
    group: dist.ProcessGroup

    def meet(self) -> None:
        """Check in and return once every job has (every rank of this job returns together)."""
        if self.rank == 0:
            self._mark("in")
            deadline = time.monotonic() + self.timeout_s
            while self._count("in") < self.jobs:
                if time.monotonic() > deadline:
                    raise RunFailure(
                        f"{self._count('in')} of {self.jobs} concurrent jobs reached their measured steps within "
                        f"{self.timeout_s:g} s (cluster.timeout_s); see the other jobs' train.log beside {self.folder}"
                    )
                time.sleep(POLL_S)
        dist.barrier(group=self.group)

    def check_out(self) -> None:
        """Say that this job's measured window has closed."""
        if self.rank == 0:
            self._mark("out")

    def all_out(self) -> bool:
        """Whether every job has closed its window (rank 0 reads it; every rank of the job gets the same answer)."""
        answer = [self.rank != 0 or self._count("out") >= self.jobs]
        dist.broadcast_object_list(answer, src=0, group=self.group)
        return bool(answer[0])

    def _mark(self, side: str) -> None:
        where = self.folder / side
        where.mkdir(parents=True, exist_ok=True)
        os.close(tempfile.mkstemp(dir=where)[0])

    def _count(self, side: str) -> int:
        where = self.folder / side
        return sum(1 for _ in where.iterdir()) if where.is_dir() else 0


def open_gate(folder: str | None, jobs: int, timeout_s: float, rank: int) -> Gate | None:
    """The gate of ``train.gate`` (None where the run is not one of a concurrent workload); every rank calls it at
    the same point, as it makes a process group."""
    if folder is None:
        return None
    group = dist.new_group(backend="gloo")  # every rank of the job is a member
    if not isinstance(group, dist.ProcessGroup):
        raise RunFailure(f"rank {rank} is not in its concurrent job's gate group")
    return Gate(Path(folder), jobs, timeout_s, rank, group)
