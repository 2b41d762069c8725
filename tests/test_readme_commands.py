"""Every shell command the README shows runs here: quick ones as they are, long ones as dry runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent


def readme_commands(text: str) -> list[str]:
    """The commands of the ```sh blocks of `text`: continuation lines joined, comments and blank lines dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\s*\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def dry_run(command: str) -> list[str]:
    """The argv that checks `command` without its long work: make -n, snakemake -n, or the command itself."""
    argv = shlex.split(command)
    if argv[0] == "make":
        return ["make", "-n", *argv[1:]]
    if argv[0] == "snakemake":
        if "--profile" in argv:  # submitting to SLURM is not checked here: the workflow's parse and DAG are
            at = argv.index("--profile")
            argv = argv[:at] + argv[at + 2 :]
        return [str(BIN / "snakemake"), "-n", *argv[1:]]
    if argv[0] == "ralp-pipe":
        return [str(BIN / "ralp-pipe"), *argv[1:]] if "--help" in argv else [str(BIN / "ralp-pipe"), argv[1], "--help"]
    raise AssertionError(f"README.md shows `{command}`, which this test does not know how to check: add it here")


def test_readme_shows_its_commands_and_fits_a_screen_budget() -> None:
    text = README.read_text()
    commands = readme_commands(text)
    assert "make run" in commands and "make test" in commands
    assert any(c.startswith("snakemake") for c in commands)
    assert len(text.splitlines()) <= 250


def test_the_parser_joins_continuations_and_drops_comments(tmp_path: Path) -> None:
    text = "```sh\nmake run   # the default\n# a note\nsnakemake --cores all \\\n  --config experiment=smoke\n```\n"
    assert readme_commands(text) == ["make run", "snakemake --cores all --config experiment=smoke"]
    folder = tmp_path
    assert with_sources_in("x 'd={a: [dataset.source=/data/ILSVRC2012/train]}'", folder) == (
        f"x 'd={{a: [dataset.source={folder / 'train'}]}}'"
    )
    with pytest.raises(AssertionError, match="does not know"):
        dry_run("rm -rf results")


def with_sources_in(command: str, folder: Path) -> str:
    """`command` with each ``dataset.source=PATH`` (real ImageNet, not here) pointing at an empty folder of `folder`."""

    def stand_in(match: re.Match[str]) -> str:
        source = folder / Path(match[1]).name
        source.mkdir(parents=True, exist_ok=True)
        return f"dataset.source={source}"

    return re.sub(r"dataset\.source=(/[^\],\s'\"]+)", stand_in, command)


def _run(command: str, folder: Path) -> None:
    argv = dry_run(with_sources_in(command, folder))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"README command `{command}` (checked as {argv}) failed:\n{output}"


QUICK = [c for c in readme_commands(README.read_text()) if not c.startswith("snakemake")]
# `ralp-pipe STAGE ...` is checked as `ralp-pipe STAGE --help`, a subprocess importing the stage's module (torch and
# torchvision for most: 3-4 s); the bare `ralp-pipe --help` and the make dry runs stay in the fast suite
QUICK_PARAMS = [pytest.param(c, marks=pytest.mark.slow) if re.match(r"ralp-pipe \w", c) else c for c in QUICK]
WORKFLOW = [c for c in readme_commands(README.read_text()) if c.startswith("snakemake")]


@pytest.mark.parametrize("command", QUICK_PARAMS)
def test_quick_readme_command_runs(command: str, tmp_path: Path) -> None:
    _run(command, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", WORKFLOW)
def test_readme_workflow_command_dry_runs(command: str, tmp_path: Path) -> None:
    _run(command, tmp_path)
