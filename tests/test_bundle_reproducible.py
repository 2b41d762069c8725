"""Bundles byte for byte: the same records aggregated twice, apart, with other mtimes and permissions.

tests/test_bundle.py re-bundles one folder of tables; here everything from `aggregate` on is done
twice in separate folders, at least a second apart (so anything stamped with the clock, at the
gzip's, tar's or PNG's one-second resolution, differs), with the second folder's inputs given
other modification times and permissions. Every member is compared, parquet and PNG included.
environment.json describes the interpreter, packages, git state and host at bundle time: it is
equal as long as nobody changes the checkout's git state between the two builds.
"""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import pytest

from ralp_pipe.results.bundle import make_bundle
from workflow_records import write_aggregated

pytestmark = pytest.mark.slow  # two aggregations with plots, seconds each

LOCK = Path(__file__).resolve().parents[1] / "envs" / "requirements.lock"
INCLUDES = ("configs", "runs", "plans", "concurrent", "tables")
NAME = "smoke-0123.tar.gz"


def aggregated(root: Path) -> Path:
    """Records of 2 models x 2 networks x 2 N x 4 strategies, a config and a workload, aggregated below `root`."""
    return write_aggregated(root, networks=("1gbit", "100mbit"))


def scramble(root: Path) -> None:
    """Give every input file and folder below `root` another mtime and other permissions."""
    for i, path in enumerate(sorted(p for name in INCLUDES for p in (root / name).rglob("*"))):
        os.utime(path, (1_000_000_000 + 7 * i, 1_000_000_000 + 13 * i))
        path.chmod(0o750 if path.is_dir() else (0o600 if i % 2 else 0o640))


def bundled(root: Path) -> Path:
    """The bundle of `root`'s inputs, written below `root`/bundles."""
    out = root / "bundles" / NAME
    make_bundle(out, root, [root / name for name in INCLUDES], LOCK)
    return out


def members(path: Path) -> dict[str, bytes]:
    """Name -> contents of every file member of a bundle."""
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_two_aggregations_of_the_same_records_bundle_to_the_same_bytes(tmp_path: Path) -> None:
    """Same records, separate folders, other times and permissions: identical members and identical bundles."""
    first = bundled(aggregated(tmp_path / "a"))
    time.sleep(1.1)  # clock stamps have one-second resolution: the second build falls in another second
    second_root = aggregated(tmp_path / "b")
    scramble(second_root)
    second = bundled(second_root)
    one, two = members(first), members(second)
    assert sorted(one) == sorted(two)
    kinds = {name.rsplit(".", 1)[-1] for name in one}
    assert {"parquet", "png", "json", "md"} <= kinds  # the comparison covers binary tables and plots
    differing = sorted(name for name in one if one[name] != two[name])
    assert differing == [], f"members that differ between the two builds: {differing}"
    assert first.read_bytes() == second.read_bytes()  # and the archive around them: headers, order, gzip
