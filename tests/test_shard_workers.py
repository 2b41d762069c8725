"""The worker processes of `prepare-shards` die with it, however it ends (they hold its pipe and log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # generates a few thousand JPEGs in a pool

# A pool starts in about a second; spawned workers need a few more to import and start working.
START_S, GONE_S = 60.0, 10.0


def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_pool_workers_die_with_prepare_shards(tmp_path: Path, signum: int) -> None:
    argv = [
        sys.executable,
        "-m",
        "ralp_pipe.cli",
        "prepare-shards",
        "--no-progress",
        "dataset=synthetic22k",
        "dataset.synthetic.images_per_class=2",
        "dataset.shards.workers=2",
        f"paths.results={tmp_path}",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_S
        workers: list[int] = []
        while len(workers) < 2:
            assert proc.poll() is None, f"prepare-shards ended before its pool started: {proc.stderr.read()!r}"
            assert time.monotonic() < deadline, "no pool workers appeared"
            workers = [c for c in _children(proc.pid) if "multiprocessing" in _cmdline(c)]
            time.sleep(0.1)
        os.kill(proc.pid, signum)
        proc.wait(timeout=GONE_S + 30)
        deadline = time.monotonic() + GONE_S
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], f"pool workers outlived prepare-shards ({signum.name})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
