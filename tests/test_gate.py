"""The concurrent workload's gate: a job's window starts once every job has checked in, and it keeps stepping until
every job has checked out; a job that never arrives fails the wait by name."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch.distributed as dist

from ralp_pipe.engine.gate import open_gate
from ralp_pipe.errors import RunFailure


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A real gloo process group of one rank (this process), as a job's rank 0 has."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _other_job(folder: Path, side: str) -> None:
    """What another job's rank 0 does at the gate: leave a mark in `side`."""
    (folder / side).mkdir(parents=True, exist_ok=True)
    os.close(tempfile.mkstemp(dir=folder / side)[0])


def test_a_job_starts_its_window_only_once_the_other_arrived_and_steps_on_until_it_left(
    tmp_path: Path, one_rank: None
) -> None:
    folder = tmp_path / "gate"
    gate = open_gate(str(folder), 2, timeout_s=10, rank=0)
    assert gate is not None and open_gate(None, 2, 10, 0) is None  # a run alone has no gate
    arrives = threading.Timer(0.3, _other_job, (folder, "in"))
    began = time.monotonic()
    arrives.start()
    gate.meet()
    assert time.monotonic() - began >= 0.3  # it waited for the other job
    gate.check_out()
    assert not gate.all_out()  # the other job is still measuring: keep loading the link
    _other_job(folder, "out")
    assert gate.all_out()
    assert [len(list((folder / side).iterdir())) for side in ("in", "out")] == [2, 2]


def test_a_job_that_never_arrives_fails_the_wait_naming_the_folder(tmp_path: Path, one_rank: None) -> None:
    gate = open_gate(str(tmp_path / "gate"), 3, timeout_s=0.2, rank=0)
    assert gate is not None
    _other_job(tmp_path / "gate", "in")
    with pytest.raises(RunFailure, match=r"2 of 3 concurrent jobs reached their measured steps within 0.2 s"):
        gate.meet()
