"""What a run ran on: host, CPU, memory, GPUs, library versions and the git revision."""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from ralp_pipe.runtime import cgroup

# mallopt(3) parameters: never serve an allocation by mmap; give the heap's free top back only past 1 GiB
_M_MMAP_MAX, _M_TRIM_THRESHOLD = -4, -1
_TRIM_THRESHOLD_BYTES = 1 << 30
_keeps_freed_memory = False

PACKAGES = ("torch", "torchvision", "nvidia-dali-cuda130", "numpy", "pandas", "hydra-core", "snakemake")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, object]:
    """Host name, CPU model, count and the CPUs this process may use, its torch threads, memory, and each GPU."""
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_gb": round(props.total_memory / 1e9, 2)})
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 2),
        "gpus": gpus,
        "platform": platform.platform(),
        "malloc_keeps_freed": _keeps_freed_memory,
    }


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for the next allocation; False where the C library has no mallopt.

    A training step frees and allocates the same large tensors again (gradients, activations).
    By default glibc serves each large block by a fresh mmap and unmaps it when freed, so every
    step faults in and zeroes new pages: on one thread that was a third to a half of ResNet-18's
    and AlexNet's forward+backward here, and how much depended on what the process had freed
    before (a profile and a run of the same model disagreed by 1.7x). GPU allocators cache
    freed blocks, and so does the heap this sets up; every process that times or trains calls it.
    """
    global _keeps_freed_memory
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the C library this process runs on
    if mallopt is not None:
        _keeps_freed_memory = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))
    return _keeps_freed_memory


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask: what ranks started here share)."""
    return len(os.sched_getaffinity(0))


def usable_memory() -> tuple[int, str]:
    """Memory processes started here may use, and what sets it (for messages): the machine's, or the limit
    of this process's memory cgroup (v2 or v1, set on it or any cgroup above it) where lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    own = cgroup.memory_cgroup()
    if own is None or own.limit_bytes is None or own.limit_bytes >= total:
        return total, "this machine's"
    return own.limit_bytes, f"the limit of memory cgroup {own.limit_folder}"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (the kernel's high-water mark)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def threads_per_rank(ranks_on_host: int) -> int:
    """Torch threads of one of `ranks_on_host` training ranks on this host (oversubscription ruins throughput).

    Under SLURM a rank gets its task's CPUs; elsewhere an even share of the CPUs this process may use.
    """
    if "SLURM_CPUS_PER_TASK" in os.environ:
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    return max(1, usable_cores() // ranks_on_host)


def versions() -> dict[str, str | None]:
    """Versions of Python, CUDA (as torch was built) and the packages a run depends on."""
    found: dict[str, str | None] = {"python": sys.version.split()[0], "cuda": torch.version.cuda}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_revision(where: Path = Path(__file__).resolve().parent) -> str | None:
    """Commit of the checkout holding this package (suffixed "-dirty" with local changes), or None."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}-dirty" if dirty else rev
