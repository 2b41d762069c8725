"""`ralp-pipe train` in hostile places: a file as --out, full and read-only disks, too many ranks for the host,
Ctrl-C and SIGTERM mid-run, staging folders of killed drivers, failed reruns over an older run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralp_pipe import cli

SMALL = ["model=resnet18", "strategy=ps", "cluster.gpus=2", "train.batch_size=2", "train.image_size=32",
         "train.warmup_steps=1"]


def _processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains `text`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _default_sigint() -> None:
    """In the child before exec: take SIGINT's default (a background shell leaves it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train(out: Path, *overrides: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run `ralp-pipe train --out OUT` on the small model in a subprocess."""
    return subprocess.run([sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *SMALL, *overrides],
                          capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


def _one_line(stderr: str, kind: str) -> str:
    """The single stderr line of a refused or stopped run, checked to be the CLI's and traceback-free."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"ralp-pipe train: {kind}: "), stderr
    return lines[0]


# --- 4: Ctrl-C and SIGTERM -----------------------------------------------------------------------------------------

@pytest.mark.slow  # a `ralp-pipe train` subprocess with 3 ranks
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_train_exits_128_plus_signal_with_one_line_and_leaves_nothing(tmp_path: Path, signum: int) -> None:
    runs = tmp_path / "runs"
    out = runs / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *SMALL, "train.measure_steps=50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(runs.glob(".run.ranks-*/rank*.log")):  # the driver is starting its ranks right now
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.01)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, stderr
    assert _one_line(stderr, "stopped") == f"ralp-pipe train: stopped: interrupted by {signal.Signals(signum).name}"
    assert _processes_mentioning(str(tmp_path)) == [], "ranks outlived the interrupted run"
    assert list(runs.iterdir()) == [], "the interrupted run left its staging folder or output"


SWALLOWING_STAGE = '''
import signal, time

class Swallower:
    def __del__(self):  # an exception raised here is only printed ("Exception ignored in ..."), like in a fork hook
        signal.raise_signal(signal.{signal})
        for _ in range(1000):
            pass

def add_arguments(parser):
    pass

def main(args):
    Swallower()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return 0
'''


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_raised_where_python_swallows_exceptions_still_stops_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signame: str
) -> None:
    module = f"swallowing_stage_{signame.lower()}"
    (tmp_path / f"{module}.py").write_text(SWALLOWING_STAGE.replace("{signal}", signame))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.STAGES, "train", (module, "test stage"))
    began = time.monotonic()
    status = cli.main(["train"])
    assert status == 128 + signal.Signals[signame], "the signal was lost in __del__ and the stage ran to its end"
    assert time.monotonic() - began < 5
    err = capsys.readouterr().err
    assert err == f"ralp-pipe train: stopped: interrupted by {signame}\n", err


@pytest.mark.slow  # a `ralp-pipe train` subprocess
def test_signal_while_the_driver_imports_torch_gives_one_line_too(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(tmp_path / "run"), *SMALL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # past the interpreter's start, inside the seconds-long import of the stage's modules
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert _one_line(stderr, "stopped") == "ralp-pipe train: stopped: interrupted by SIGTERM"
