"""The worker processes of `prepare-shards` die with it, however it ends (they hold its pipe and log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.procs import alive, children, cmdline

pytestmark = pytest.mark.slow  # generates a few thousand JPEGs in a pool

# A pool starts in about a second; spawned workers need a few more to import and start working.
START_S, GONE_S = 60.0, 10.0


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
            workers = [c for c in children(proc.pid) if "multiprocessing" in cmdline(c)]
            time.sleep(0.1)
        os.kill(proc.pid, signum)
        proc.wait(timeout=GONE_S + 30)
        deadline = time.monotonic() + GONE_S
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if alive(w)], f"pool workers outlived prepare-shards ({signum.name})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
