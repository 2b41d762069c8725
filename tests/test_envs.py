"""The pinned environments agree: the conda file, the pip lock and the project's dependencies."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        match = re.match(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def _lock() -> dict[str, str]:
    return _pins((ROOT / "envs" / "requirements.lock").read_text().splitlines())


def _conda_pip() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "envs" / "conda.yaml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "envs/conda.yaml needs exactly one pip: section"
    return _pins(pip_sections[0])


def test_every_conda_pin_matches_the_lock() -> None:
    lock, conda = _lock(), _conda_pip()
    mismatched = {name: (version, lock.get(name)) for name, version in conda.items() if lock.get(name) != version}
    assert not mismatched, f"conda.yaml pins differ from requirements.lock (conda, lock): {mismatched}"


def test_every_direct_dependency_is_pinned_in_both() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {re.split(r"[<>=\[ ]", dep)[0].lower() for dep in direct}
    lock, conda = _lock(), _conda_pip()
    assert names - lock.keys() == set(), f"not pinned in requirements.lock: {names - lock.keys()}"
    assert names - conda.keys() == set(), f"not pinned in conda.yaml: {names - conda.keys()}"


def test_the_paper_stack_is_pinned_as_required() -> None:
    lock = _lock()
    assert lock["torch"] == "2.14.1" and lock["torchvision"] == "0.29.1"
    assert lock["snakemake"].startswith("9.")
    for name in ("nvidia-dali-cuda130", "hydra-core", "pandas", "pyarrow"):
        assert name in lock
