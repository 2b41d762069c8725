"""`ralp-pipe bundle`: one reproducible tar.gz of an experiment's configs, raw records, tables and environment.

Layout (every member below one top folder named like the bundle)::

    <name>/configs/<experiment>.json     resolved workflow settings and configs (from the workflow)
    <name>/runs/<run>/metrics.json       raw records, as written by `ralp-pipe train`
    <name>/runs/<run>/steps.parquet
    <name>/plans/... <name>/profiles/... planner inputs and outputs
    <name>/tables/...                    runs.parquet, speedups.parquet, summary.md, plots/*.png
    <name>/environment.json              package versions, Python, platform, git revision, hardware
    <name>/requirements.lock             the pinned environment
    <name>/SHA256SUMS                    sha256 of every other member (`sha256sum -c` format)

Members are written in sorted order with fixed owner and time, so equal inputs give equal bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from ralp_pipe.atomic import atomic_path, check_writable
from ralp_pipe.config import CONFIG_DIR
from ralp_pipe.errors import BundleRefused, ConfigError, disk_errors
from ralp_pipe.runtime import hardware

CHECKSUMS = "SHA256SUMS"
ENVIRONMENT = "environment.json"
LOCK = "requirements.lock"
REPO_ROOT = CONFIG_DIR.parent


def git_revision(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit of `repo` and whether its working tree differs from it ("unknown" outside git)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": head, "dirty": bool(status.strip())}


def environment() -> dict[str, Any]:
    """Package versions (importlib.metadata), interpreter, git revision and hardware."""
    packages = {
        dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions() if dist.metadata["Name"]
    }
    return {
        "python": sys.version,
        "packages": dict(sorted(packages.items(), key=lambda item: item[0].lower())),
        "git": git_revision(),
        "hardware": hardware.describe(),
    }


def sha256(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def collect(root: Path, includes: Iterable[str | Path]) -> dict[str, bytes]:
    """Contents of the included files (folders recursively), keyed by their path relative to `root`.

    An include is a path as given (absolute, or relative to the current folder) that must lie
    below `root`; members are named by the path they are found under. A symbolic link is
    followed only when its target is below `root` too; one that leads out is refused.
    """
    members: dict[str, bytes] = {}
    lexical_root, real_root = Path(os.path.abspath(root)), root.resolve()
    for include in map(Path, includes):
        path = Path(os.path.abspath(include))
        if not path.is_relative_to(lexical_root):
            raise ConfigError(
                f"bundle input {include} is not below the results folder {root}: pass --include paths inside --root"
            )
        if not path.exists():
            raise ConfigError(f"bundle input {include} does not exist: run the workflow up to this stage first")
        for file in _files(path, real_root, frozenset()):
            members[file.relative_to(lexical_root).as_posix()] = file.read_bytes()
    return members


def _files(path: Path, real_root: Path, above: frozenset[Path]) -> Iterator[Path]:
    """Files at or below `path` in name order, refusing links whose target is outside `real_root` or loops back."""
    real = path.resolve()
    if not real.is_relative_to(real_root):
        kind = "symbolic link" if path.is_symlink() else "path through a symbolic link"
        raise BundleRefused(
            f"bundle input {path} is a {kind} to {real}, outside the results folder {real_root}: "
            f"bundles never follow links out of --root; copy the file in or remove the link"
        )
    if real in above:
        raise BundleRefused(f"bundle input {path} is a symbolic link to {real}, a folder above it: remove the loop")
    if real.is_dir():
        for child in sorted(path.iterdir()):
            yield from _files(child, real_root, above | {real})
    elif real.is_file():
        yield path


def write_bundle(out: Path, members: dict[str, bytes]) -> str:
    """Write `members` plus SHA256SUMS below a top folder named after `out`; returns that folder name."""
    top = out.name.removesuffix(".tar.gz")
    checksums = "".join(f"{sha256(data)}  {name}\n" for name, data in sorted(members.items()))
    everything = {**members, CHECKSUMS: checksums.encode()}
    # No file name and time in the gzip header: equal members give equal bytes.
    with atomic_path(out) as tmp, open(tmp, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in sorted(everything.items()):
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    return top


def make_bundle(out: Path, root: Path, includes: Iterable[str | Path], lock: Path) -> str:
    """Bundle the included results with the environment and the lock file; returns the top folder."""
    members = collect(root, includes)
    for reserved in (CHECKSUMS, ENVIRONMENT, LOCK):
        if reserved in members:
            raise ConfigError(f"bundle input {root / reserved} clashes with a member the bundle writes itself")
    if not lock.is_file():
        raise ConfigError(f"lock file {lock} is missing: pass --lock with the environment's pinned requirements")
    members[LOCK] = lock.read_bytes()
    members[ENVIRONMENT] = (json.dumps(environment(), indent=2, sort_keys=True) + "\n").encode()
    return write_bundle(out, members)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe bundle`."""
    parser.add_argument("--out", type=Path, required=True, help="bundle to write (NAME.tar.gz)")
    parser.add_argument("--root", type=Path, required=True, help="results folder; members are named relative to it")
    parser.add_argument(
        "--include",
        nargs="+",
        required=True,
        help="files and folders below --root to bundle (absolute, or relative to the current folder); "
        "symbolic links are followed only to targets below --root",
    )
    parser.add_argument(
        "--lock", type=Path, default=REPO_ROOT / "envs" / "requirements.lock", help="pinned requirements to include"
    )


def main(args: argparse.Namespace) -> int:
    """Write the bundle."""
    if not args.out.name.endswith(".tar.gz"):
        raise ConfigError(f"--out {args.out} must end in .tar.gz")
    check_writable(args.out.parent, f"--out {args.out}")
    advice = "no partial bundle was left: free space there (or choose another --out) and run bundle again"
    with disk_errors(f"bundle {args.out}", args.out.parent, advice):
        top = make_bundle(args.out, args.root, args.include, args.lock)
    print(f"bundle: {top} -> {args.out}")
    return 0
