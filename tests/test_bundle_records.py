"""Verify recomputes every run's own figures from its step records: an edited record that was re-aggregated and
re-bundled (checksums, tables and plots all made to match) is refused, naming the run, the field and both values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.errors import BundleRefused
from ralp_pipe.results.bundle import make_bundle
from ralp_pipe.results.verify import verify_bundle

pytestmark = pytest.mark.slow  # the bundle fixture and each forgery aggregate and draw plots (seconds)

LOCK = Path(__file__).resolve().parents[1] / "envs" / "requirements.lock"
RUN = "synthetic1k/vgg11/n2-1gbit/ralp_n/r0"


def doubled_throughput(doc: dict[str, Any]) -> None:
    """The issue's forgery: twice the images/sec, nothing else."""
    doc["images_per_sec"] *= 2


def doubled_with_a_halved_window(doc: dict[str, Any]) -> None:
    """Twice the images/sec with the window and step time that would give it: shorter than rank 0's own steps."""
    doc["images_per_sec"] *= 2
    doc["window_s"] /= 2
    doc["step_time_s"] /= 2


def doubled_workers(doc: dict[str, Any]) -> None:
    """Twice the workers, so twice the images of a step in the same window: more workers than the steps have."""
    for key in ("workers", "images_per_step", "global_batch", "images_per_sec"):
        doc[key] *= 2


def halved_volume(doc: dict[str, Any]) -> None:
    """Half the parameter-server traffic, total and category alike."""
    for key in ("gradients", "total"):
        doc["gb_per_step"][key] /= 2


def halved_wire(doc: dict[str, Any]) -> None:
    """Half the bytes the kernel's link counters saw."""
    doc["wire_gb_per_step"] /= 2


def reforged(root: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the results below `root` with RUN's metrics.json edited, aggregated again and bundled again."""
    copy = tmp_path / "forged"
    shutil.copytree(root, copy)
    record = copy / "runs" / RUN / "metrics.json"
    doc = json.loads(record.read_text())
    edit(doc)
    record.write_text(json.dumps(doc))
    argv = ["aggregate", "--runs", str(copy / "runs"), "--plans", str(copy / "plans"), "--out", str(copy / "tables")]
    assert cli([*argv, "--concurrent", *map(str, sorted(copy.glob("concurrent/*/concurrent.json")))]) == 0
    out = copy / "bundles" / "smoke-0123.tar.gz"
    make_bundle(out, copy, [copy / name for name in ("configs", "runs", "plans", "concurrent", "tables")], LOCK)
    return out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (doubled_throughput, r"images_per_sec=480\.0, but its step records give 240\.0"),
        (
            doubled_with_a_halved_window,
            r"window_s=0\.0125, but its step records give at least 0\.0245.* \(rank 0's measured steps",
        ),
        (doubled_workers, r"workers=2, but its step records give 1"),
        (halved_volume, r"gb_per_step\.gradients=0\.01, but its step records give 0\.02"),
        (halved_wire, r"wire_gb_per_step=0\.0306.*, but its hosts' link counters give 0\.0612"),
    ],
)
def test_a_record_edited_consistently_and_reaggregated_is_refused(
    bundle: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str, capsys: pytest.CaptureFixture
) -> None:
    forged = reforged(bundle.parents[1], tmp_path, edit)
    with pytest.raises(BundleRefused, match=f"run {RUN}: metrics.json records {message}"):
        verify_bundle(forged)
    assert cli(["verify", str(forged)]) == 1
    assert f"run {RUN}: metrics.json records" in capsys.readouterr().err


def test_a_step_whose_compute_does_not_follow_from_its_waits_is_refused(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(bundle.parents[1], root)
    steps_file = root / "runs" / RUN / "steps.parquet"
    steps = pd.read_parquet(steps_file)
    steps.loc[(steps["rank"] == 0) & (steps["step"] == 2), "compute_s"] *= 2  # a step that computed longer
    steps.to_parquet(steps_file)
    out = root / "bundles" / "steps.tar.gz"
    make_bundle(out, root, [root / name for name in ("configs", "runs", "plans", "concurrent", "tables")], LOCK)
    with pytest.raises(BundleRefused, match=f"run {RUN}: steps.parquet records compute_s=.* for rank 0 step 2"):
        verify_bundle(out)


def test_a_genuine_bundle_recomputes_every_record(bundle: Path) -> None:
    assert verify_bundle(bundle).runs == 8
