"""Every shell command of the how-to pages runs here as a reader would type it (outputs under a temporary folder)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from ralp_pipe import cli
from test_readme_commands import readme_commands

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "howto").glob("*.md"))
COMMANDS = [(page.name, command) for page in PAGES for command in readme_commands(page.read_text())]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:40]}" for p, c in COMMANDS])
def test_a_howto_command_runs(page: str, command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    if argv[0] == "python":  # a benchmark: its options parse (the run itself is the benchmark's, minutes long)
        script = ROOT / argv[1]
        assert script.exists(), f"{page} runs {argv[1]}, which does not exist"
        subprocess.run([sys.executable, str(script), "--help"], check=True, capture_output=True)
        return
    assert argv[:2] == ["ralp-pipe", "simulate"], f"{page} shows `{command}`, which this test does not run"
    at = argv.index("--out")
    argv[at + 1] = str(tmp_path / argv[at + 1])
    assert cli.main(argv[1:]) == 0
    frame = pd.read_parquet(tmp_path / shlex.split(command)[at + 1] / "simulation.parquet")
    for column in ("batch_size", "image_size", "device", "gpus_per_node", "interconnect"):
        assert column in frame.columns and column in (ROOT / "docs" / "howto" / page).read_text()


def test_the_columns_of_a_simulation_are_all_documented(tmp_path: Path) -> None:
    """Every column `simulate` writes is named on the how-to page."""
    out = tmp_path / "sim"
    assert cli.main(["simulate", "--target", "v100", "--gpus", "8", "--link-gbit", "10", "--out", str(out)]) == 0
    text = (ROOT / "docs" / "howto" / "price-your-cluster.md").read_text()
    missing = [c for c in pd.read_parquet(out / "simulation.parquet").columns if f"`{c}`" not in text]
    assert not missing, f"docs/howto/price-your-cluster.md does not document {missing}"
