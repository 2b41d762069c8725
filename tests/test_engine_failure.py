"""A rank that raises, dies or hangs makes the whole run exit non-zero in bounded time, leaving nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.procs import processes_using
from support.small_run import small

# each case runs a `ralp-pipe train` subprocess with 2 ranks until one fails (15-32 s)
pytestmark = pytest.mark.slow

TIMEOUT_S, INIT_TIMEOUT_S = 10, 60
OVERRIDES = small("train.measure_steps=3", f"cluster.timeout_s={TIMEOUT_S}", f"cluster.init_timeout_s={INIT_TIMEOUT_S}")


@pytest.mark.parametrize(
    ("rank", "step", "mode", "named"),
    [
        (1, 2, "raise", "rank 1"),  # a worker raises mid-run
        (2, 1, "kill", "rank 2"),  # the PS is killed (SIGKILL)
        (0, 2, "hang", None),  # a worker hangs: the PS's receive or the run's deadline times out
    ],
)
def test_failing_rank_stops_the_run_without_output(
    tmp_path: Path, rank: int, step: int, mode: str, named: str | None
) -> None:
    out = tmp_path / "runs" / "run"
    env = {
        **os.environ,
        "RALP_PIPE_FAIL_RANK": str(rank),
        "RALP_PIPE_FAIL_STEP": str(step),
        "RALP_PIPE_FAIL_MODE": mode,
    }
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *OVERRIDES],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - began
    assert proc.returncode == 4, proc.stderr  # RunFailure's exit status
    headline = proc.stderr.splitlines()[0]
    assert headline.startswith("ralp-pipe train: run failed: "), proc.stderr  # one line from the driver, no traceback
    if named is not None:
        assert headline.startswith(f"ralp-pipe train: run failed: {named} failed first"), headline
    if named is None:
        assert "Timed out" in proc.stderr or "still running after" in proc.stderr, proc.stderr
    else:
        assert f"{named} exited with status" in proc.stderr, proc.stderr
    if mode == "kill":
        assert "SIGKILL" in proc.stderr
    if mode == "raise":
        assert "fails at step 2" in proc.stderr
    assert elapsed < INIT_TIMEOUT_S + TIMEOUT_S + 20  # the run's deadline, SIGTERM/SIGKILL grace, start-up
    assert not out.exists(), "a failed run left its output folder"
    assert list((tmp_path / "runs").iterdir()) == [], "a failed run left staging files"
    assert processes_using(str(tmp_path)) == [], "ranks outlived the failed run"
