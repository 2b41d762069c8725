"""`ralp-pipe train` in a subprocess, as the workflow's rules run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence


def train_command(out: Path, overrides: Sequence[str]) -> list[str]:
    """argv of `ralp-pipe train --out OUT OVERRIDES...` with this interpreter."""
    return [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *overrides]


def run_train(
    out: Path, overrides: Sequence[str], timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one training run into `out` and return the finished process (output captured)."""
    return subprocess.run(
        train_command(out, overrides),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
    )


def train_metrics(out: Path, overrides: Sequence[str], timeout: float = 300) -> dict[str, Any]:
    """Run one training run that must succeed; return its metrics.json."""
    proc = run_train(out, overrides, timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "metrics.json").read_text())
