"""`scripts/gpu_check.sh` end to end on the CPU (GPU_CHECK_DEVICE=cpu): every run it makes on a lent GPU,
with the same overrides, so a GPU session is not spent finding a broken script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = [
    "ps",
    "ps_sequential",
    "allreduce",
    "ralp_h",
    "ralp_h_sequential",
    "ralp_n",
    "ralp_n_sequential",
    "ps_colocated",
    "amp_allreduce",
    "amp_ralp_n",
    "dali_mixed_ps",
    "device_allreduce_n1",
    "device_ps_n2",
]
SIDE_BY_SIDE = ["allreduce_n1", "ps_n2"]  # undilated on the device, and dilated on the CPUs from its profile


@pytest.mark.slow  # every strategy trained in subprocesses, a profile, DALI shards, dilated runs: 3.7 min on a loaded 2-core machine
def test_the_gpu_check_script_runs_every_check_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if "GB/step" in line and "img/s" in line}
    assert sorted(rows) == sorted(RUNS), proc.stdout
    for line in rows.values():
        assert " cpu " in line and "every category equal: True" in line, line
    assert "profile on cpu: 12 units" in proc.stdout, proc.stdout
    compared = {line.split()[3]: line for line in proc.stdout.splitlines() if "dilated vs device:" in line}
    assert sorted(compared) == SIDE_BY_SIDE, proc.stdout
    for line in compared.values():  # the ratio is not checked: a CPU run is noisy and loopback is not slowed by D
        assert " img/s on cpu, " in line and " img/s target-equivalent dilated (" in line, line
        assert "D = 4, target cpu (profile profile-cpu.json)" in line, line
    dilated = json.loads((tmp_path / "dilated_allreduce_n1" / "metrics.json").read_text())
    assert dilated["dilation"]["mode"] == "modelled" and dilated["device"] == "cpu"
    assert proc.stdout.rstrip().endswith(f"gpu_check: all runs finished; metrics under {tmp_path}")
    assert (tmp_path / "profile-modelled.json").is_file()
    assert any("whole forward+backward" in line for line in proc.stdout.splitlines()), proc.stdout
