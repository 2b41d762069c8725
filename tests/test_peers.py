"""The peer harness on a 2-host emulated network: real Distributed TensorFlow (PS) and PyTorch DDP both train.

A tiny configuration (ResNet-18, 32 px, batch 2, N = 2 at 1 Gbit/s, 2 measured steps): each peer's
loss is finite and its busiest host link carried about the model's parameter bytes each way per step
(at N = 2 both a PS step and a ring all-reduce move one model's worth through every host link).
TensorFlow comes from the ``peers`` extra, which ``make test`` installs: without it this test fails.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from support.emulated_hosts import emulation_available

pytestmark = [pytest.mark.slow, pytest.mark.netns]

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"
RESNET18_PARAMETERS = 11_689_512  # torchvision's ResNet-18 at 1000 classes


def test_real_peers_train_on_emulated_hosts(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail(
            "TensorFlow is not installed: the peer harness needs the `peers` extra "
            "(`make test` installs it; by hand: pip install -e '.[peers]')"
        )
    available, why = emulation_available()
    assert available, f"the peer harness runs on emulated hosts: {why}"
    argv = [
        sys.executable,
        str(HARNESS),
        "--models=resnet18",
        "--hosts=2",
        "--rates=1gbit",
        "--size=32",
        "--batch=2",
        "--repeats=1",
        "--warmup=1",
        "--steps=2",
        "--peers",
        "tf_ps",
        "ddp",
        "--no-ours",
        "--no-prediction",
        f"--out={tmp_path}",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = pd.read_parquet(tmp_path / "peers.parquet").set_index("peer")
    assert sorted(rows.index) == ["ddp", "tf_ps"]
    parameter_mb = RESNET18_PARAMETERS * 4 / 1e6
    for peer, row in rows.iterrows():
        assert row.peer_parameters == RESNET18_PARAMETERS, f"{peer} trained another model"
        assert math.isfinite(row.peer_loss_first) and math.isfinite(row.peer_loss_last), f"{peer}'s loss"
        assert row.peer_images_per_sec > 0
        for side in ("peer_busiest_tx_mb", "peer_busiest_rx_mb"):
            assert 0.95 * parameter_mb < row[side] < 1.3 * parameter_mb, (
                f"{peer}'s busiest link moved {row[side]:.1f} MB per step ({side}), not about the "
                f"model's {parameter_mb:.1f} MB"
            )
    assert (tmp_path / "peers.md").read_text().count("| resnet18 32 px b2 | 2 | 1gbit |") == 2


def test_ps_cpu_terms_are_measured_on_tensorflow(tmp_path: Path) -> None:
    """`--ps-cpu`: TensorFlow's apply and sum ops on two sizes, RecvTensor reads of two counts, lines through them."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail("TensorFlow is not installed: the peer harness needs the `peers` extra (pip install -e '.[peers]')")
    available, why = emulation_available()
    assert available, f"the RecvTensor measurement runs on emulated hosts: {why}"
    argv = [sys.executable, str(HARNESS), "--ps-cpu", "--ps-cpu-sizes", "1", "16", "--ps-cpu-counts", "1", "64"]
    done = subprocess.run([*argv, "--repeats=2", f"--out={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads((tmp_path / "ps_cpu.json").read_text())
    assert record["command"].startswith("python benchmarks/peers --ps-cpu")
    found = record["figures"]
    assert len(found["ops"]) == 3 * 2 * 2 and len(found["rpc"]) == 2 * 2  # ops x sizes x repeats, counts x repeats
    for op in ("apply_momentum", "apply_gradient_descent", "add_n"):
        assert 0.05 < found["fits"][op]["gbytes_per_s"] < 500, f"{op}: {found['fits'][op]}"
    assert 0 < found["fits"]["recv_tensor"]["s_per_tensor"] < 0.01, found["fits"]["recv_tensor"]
    assert "| RecvTensor |" in done.stdout
