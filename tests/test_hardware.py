"""What a process that times or trains sets up on this host: an allocator that reuses freed memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Steady-state training steps of one layer whose 64 MiB weight gradient is allocated and freed
# every step; prints the median page faults of a step once the heap has settled.
STEPS = """
import resource, statistics, sys, torch
from ralp_pipe.runtime import hardware
if sys.argv[1] == "keep":
    assert hardware.keep_freed_memory()
layer, x = torch.nn.Linear(4096, 4096), torch.randn(4, 4096)
def faults_of_a_step() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    layer(x).sum().backward()
    layer.weight.grad = None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(8):  # glibc settles its heap in a few steps
    faults_of_a_step()
print(statistics.median(faults_of_a_step() for _ in range(9)))
"""
GRADIENT_PAGES = (64 << 20) // 4096


def _faults_per_step(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.slow  # two Python subprocesses timing a training step each
def test_a_step_reuses_the_memory_the_last_one_freed_instead_of_faulting_fresh_pages_in() -> None:
    assert _faults_per_step("default") > GRADIENT_PAGES // 2  # glibc's default: a fresh mapping every step
    assert _faults_per_step("keep") < GRADIENT_PAGES // 100
