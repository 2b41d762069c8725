"""Verify refuses a bundle whose summary.md or a plot does not follow from its tables, checksums recomputed to match."""

from __future__ import annotations

import dataclasses
import json
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.contract.layout import CONCURRENT_FILE
from ralp_pipe.errors import BundleRefused
from ralp_pipe.results.aggregate import build_tables, load_records, load_workloads
from ralp_pipe.results.bundle import make_bundle
from ralp_pipe.results.plots import speedup
from ralp_pipe.results.verify import verify_bundle
from support.bundles import forge, members

pytestmark = pytest.mark.slow  # the bundle fixture aggregates and draws plots, verify redraws them (seconds)

TOP = "smoke-0123"
LOCK = Path(__file__).resolve().parents[1] / "envs" / "requirements.lock"


def test_a_good_bundle_has_its_plots_redrawn_and_equal(bundle: Path, capsys: pytest.CaptureFixture) -> None:
    assert verify_bundle(bundle).plots_redrawn is None
    assert cli(["verify", str(bundle)]) == 0
    assert "plots redrawn)" in capsys.readouterr().out


def test_a_forged_summary_is_refused(bundle: Path, tmp_path: Path) -> None:
    name = f"{TOP}/tables/summary.md"
    original = members(bundle)[name]
    data = original.replace(b"| 240.0 |", b"| 340.0 |").replace(b"| 2.40x |", b"| 3.40x |")
    assert data != original  # the forgery changed a throughput and its speedup consistently
    forged = forge(bundle, tmp_path / "forged.tar.gz", {name: data})
    with pytest.raises(BundleRefused, match="summary.md differs from the summary recomputed"):
        verify_bundle(forged)


def test_a_plot_drawn_from_other_figures_is_refused(bundle: Path, tmp_path: Path) -> None:
    contents = members(bundle)
    root = bundle.parents[1]
    tables = build_tables(
        load_records([root / "runs"], [root / "plans"]),
        load_workloads(sorted(root.glob(f"concurrent/*/{CONCURRENT_FILE}"))),
    )
    runs = tables.runs.copy()
    runs.loc[runs["strategy"] == "ralp_n", "speedup_vs_ps"] *= 1.5  # a flattering plot, a real PNG
    speedup(dataclasses.replace(tables, runs=runs), tmp_path / "speedup.png")
    name = f"{TOP}/tables/plots/speedup.png"
    assert (tmp_path / "speedup.png").read_bytes() != contents[name]
    forged = forge(bundle, tmp_path / "forged.tar.gz", {name: (tmp_path / "speedup.png").read_bytes()})
    with pytest.raises(BundleRefused, match="plots/speedup.png differs from the plot redrawn"):
        verify_bundle(forged)
    swapped = forge(bundle, tmp_path / "swapped.tar.gz", {name: contents[f"{TOP}/tables/plots/gb_per_step.png"]})
    with pytest.raises(BundleRefused, match="plots/speedup.png differs"):
        verify_bundle(swapped)


def test_a_missing_plot_is_refused(bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(bundle.parents[1], root)
    (root / "tables" / "plots" / "predicted_vs_measured.png").unlink()
    out = root / "bundles" / "without-plot.tar.gz"
    make_bundle(out, root, [root / name for name in ("configs", "runs", "plans", "concurrent", "tables")], LOCK)
    with pytest.raises(BundleRefused, match="lacks tables/plots/predicted_vs_measured.png"):
        verify_bundle(out)


def test_plots_of_other_drawing_versions_are_reported_not_redrawn(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    name = f"{TOP}/environment.json"
    environment = json.loads(members(bundle)[name])
    packages = environment["packages"]
    key = next(k for k in packages if k.lower() == "matplotlib")
    packages[key] = "0.0.1"
    forged = forge(bundle, tmp_path / "other.tar.gz", {name: json.dumps(environment).encode()})
    assert verify_bundle(forged).plots_redrawn == f"drawn with matplotlib 0.0.1 (here {version('matplotlib')})"
    assert cli(["verify", str(forged)]) == 0
    assert "plots NOT redrawn: drawn with matplotlib 0.0.1" in capsys.readouterr().out
