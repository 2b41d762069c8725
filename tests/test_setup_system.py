"""`make test` installs the system packages its SLURM and network tests need where it can (as root), says in one
line what to do where it cannot, and costs nothing when they are there: scripts/setup-system.sh with stand-ins
for the system's commands (`id`, `apt-get`, the packages' programs) on an otherwise empty PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "setup-system.sh"
PROGRAMS = {  # what the script looks for -> the Debian package that has it
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "munged": "munge",
    "ip": "iproute2",
    "tc": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setpriv": "util-linux",
}
SLURM = ("slurm-client", "slurmctld", "slurmd")


def _stand_in(folder: Path, name: str, body: str = "exit 0") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run(
    tmp_path: Path, *args: str, root: bool, missing: tuple[str, ...], apt: str | None = "exit 0"
) -> tuple[int, str, str]:
    """Run the script with `missing` packages' programs absent and an apt-get that ends as `apt` says (None: no
    apt-get); returns its status, stderr and apt-get's calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sort", "tr"):  # what the script runs besides its builtins
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    for program, package in PROGRAMS.items():
        if package not in missing:
            _stand_in(bin_dir, program)
    _stand_in(bin_dir, "id", f"echo {0 if root else 1000}")
    calls = tmp_path / "apt-get.calls"
    if apt is not None:
        _stand_in(bin_dir, "apt-get", f'echo "$*" >> {calls}\n{apt}')
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )
    return proc.returncode, proc.stderr, calls.read_text() if calls.exists() else ""


def test_make_test_sets_up_the_system_packages_before_its_tests() -> None:
    dry = subprocess.run(["make", "-n", "-C", str(REPO), "test"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    setup = next(i for i, line in enumerate(lines) if "scripts/setup-system.sh --best-effort" in line)
    tests = next(i for i, line in enumerate(lines) if "scripts/test.sh" in line)
    assert setup < tests


def test_as_root_it_installs_the_missing_packages(tmp_path: Path) -> None:
    status, stderr, calls = _run(tmp_path, "--best-effort", root=True, missing=SLURM)
    assert status == 0, stderr
    assert calls.splitlines() == ["update -qq", f"install -y -qq --no-install-recommends {' '.join(SLURM)}"]


@pytest.mark.parametrize("root", [True, False])
def test_with_everything_there_it_does_nothing(tmp_path: Path, root: bool) -> None:
    assert _run(tmp_path, "--best-effort", root=root, missing=()) == (0, "", "")


@pytest.mark.parametrize(
    ("root", "apt", "why"),
    [(False, "exit 0", "not root"), (True, None, "no apt-get"), (True, "exit 100", "apt-get failed")],
)
def test_where_it_cannot_install_make_test_goes_on_after_one_line_saying_what_to_do(
    tmp_path: Path, root: bool, apt: str | None, why: str
) -> None:
    status, stderr, _ = _run(tmp_path, "--best-effort", root=root, missing=("munge", *SLURM), apt=apt)
    assert status == 0
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("setup-system: installing")]
    assert len(lines) == 1 and why in lines[0], stderr
    assert "as root run: apt-get install -y munge slurm-client slurmctld slurmd" in lines[0]


def test_without_best_effort_a_missing_package_it_cannot_install_fails(tmp_path: Path) -> None:
    status, stderr, _ = _run(tmp_path, root=False, missing=("iproute2",))
    assert status == 1 and "missing iproute2" in stderr and len(stderr.strip().splitlines()) == 1
