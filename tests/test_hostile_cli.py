"""One line on stderr, never a traceback, for the foreseeable mistakes of a user of the `ralp-pipe` command:
Ctrl-C to the whole process group, full and read-only result folders, bad overrides and data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.procs import group

RALP_PIPE = Path(sys.executable).with_name("ralp-pipe")
SMALL = [
    "cluster=local",
    "model=resnet18",
    "strategy=ps",
    "cluster.gpus=2",
    "train.batch_size=2",
    "train.image_size=32",
    "train.warmup_steps=1",
    "train.loader=synthetic",
]


def one_line(stderr: str, stage: str, kind: str) -> str:
    """The single stderr line of a refused or stopped command, checked to be the CLI's and traceback-free."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"ralp-pipe {stage}: {kind}: "), stderr
    return lines[0]


def ralp_pipe(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the `ralp-pipe` command with `argv`."""
    return subprocess.run([str(RALP_PIPE), *argv], capture_output=True, text=True, timeout=timeout)


# --- Ctrl-C in a terminal: SIGINT to the whole process group ----------------------------------------------------------


def _torch_loading(pgid: int, driver: int) -> bool:
    """Whether a process of group `pgid` other than `driver` (the fork server) has begun to load torch."""
    for pid in group(pgid):
        try:
            if pid != driver and "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow  # a `ralp-pipe train` subprocess, stopped while its fork server imports torch
def test_ctrl_c_to_the_process_group_during_train_start_up_prints_one_line(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [str(RALP_PIPE), "train", "--out", str(tmp_path / "run"), *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 60
        while not _torch_loading(proc.pid, proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the fork server never loaded torch"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert one_line(stderr, "train", "stopped") == "ralp-pipe train: stopped: interrupted by SIGINT"
    deadline = time.monotonic() + 10
    while group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group(proc.pid) == [], "processes of the interrupted command's group were left running"
