"""The configuration is package data: a wheel built from the checkout carries config/ (as ``ralp_pipe/conf``) and,
installed away from the checkout, composes and runs a stage from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from ralp_pipe.config import CONFIG_DIR

REPO = Path(__file__).resolve().parents[1]


def test_in_a_checkout_the_configuration_is_the_tree_users_edit() -> None:
    assert CONFIG_DIR == REPO / "config"  # src/ralp_pipe/conf links there
    assert (REPO / "src" / "ralp_pipe" / "conf").resolve() == REPO / "config"


@pytest.mark.slow  # builds a wheel (~5 s) and runs two commands from it (~10 s)
def test_an_installed_wheel_composes_its_configuration_outside_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", source / "src", symlinks=True, ignore=ignore)
    shutil.copytree(REPO / "config", source / "config")
    build = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q"]
    built = subprocess.run([*build, "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("ralp_pipe-*.whl")
    shipped = {
        Path(name).relative_to("ralp_pipe/conf") for name in zipfile.ZipFile(wheel).namelist() if "/conf/" in name
    }
    assert shipped == {path.relative_to(REPO / "config") for path in (REPO / "config").rglob("*") if path.is_file()}
    site = tmp_path / "site"  # installed: the wheel unpacked onto the path, ahead of the checkout's editable install
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = "import ralp_pipe, ralp_pipe.config as c; print(ralp_pipe.__file__); print(c.CONFIG_DIR)"
    found = subprocess.run([sys.executable, "-c", where], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    package, config = found.stdout.split()
    assert Path(package).is_relative_to(site) and Path(config) == site / "ralp_pipe" / "conf"
    command = "import sys; from ralp_pipe.cli import run; sys.argv[0] = 'ralp-pipe'; run()"
    composed = subprocess.run(
        [sys.executable, "-c", command, "simulate", "--cfg", "--target", "a100", "model=vgg16", "strategy=dtf"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert composed.returncode == 0, composed.stderr
    printed = yaml.safe_load(composed.stdout)
    names = (printed["model"]["name"], printed["device"]["name"], printed["strategy"]["name"])
    assert names == ("vgg16", "a100", "dtf")
    helped = subprocess.run(
        [sys.executable, "-c", command, "simulate", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert helped.returncode == 0 and "simulate" in helped.stdout, helped.stderr
