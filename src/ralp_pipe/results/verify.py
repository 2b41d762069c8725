"""`ralp-pipe verify BUNDLE`: refuse unsafe or tampered bundles, then recompute the tables and compare.

Order matters: every member header is checked (no absolute or `..` paths, no links, devices or
other special files, one top folder, no duplicates) before any content is read, and contents
are only ever read with ``extractfile`` into a private temporary folder, never extracted by
tarfile itself.
"""

from __future__ import annotations

import argparse
import hashlib
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pandas as pd

from ralp_pipe.results.aggregate import TABLE_FILES, build_tables, load_records, load_workloads
from ralp_pipe.results.bundle import CHECKSUMS
from ralp_pipe.config import ConfigError

CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that is unsafe, incomplete, tampered with or whose tables do not recompute."""


@dataclass
class Verified:
    """What a successful verification checked."""

    top: str
    files: int
    runs: int


def check_members(members: list[tarfile.TarInfo]) -> str:
    """Refuse unsafe member headers; returns the single top folder name."""
    seen: set[str] = set()
    tops: set[str] = set()
    for member in members:
        name = member.name
        path = PurePosixPath(name)
        if not name or name.startswith("/") or "\\" in name or path.is_absolute():
            raise BundleError(f"member {name!r} has an absolute or non-POSIX path")
        if any(part in ("..", "") for part in name.rstrip("/").split("/")):
            raise BundleError(f"member {name!r} leaves the bundle folder ('..' or empty path parts)")
        if member.issym() or member.islnk():
            raise BundleError(f"member {name!r} is a link (to {member.linkname!r}); bundles hold only plain files")
        if not (member.isfile() or member.isdir()):
            raise BundleError(f"member {name!r} is a device, fifo or other special file")
        if name in seen:
            raise BundleError(f"member {name!r} appears twice")
        seen.add(name)
        tops.add(path.parts[0])
    if len(tops) != 1:
        raise BundleError(f"a bundle has exactly one top folder; found {sorted(tops) or 'none'}")
    return tops.pop()


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise BundleError(f"member {member.name!r} cannot be read")
    return handle.read()


def _sha256(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    digest = hashlib.sha256()
    handle = tar.extractfile(member)
    if handle is None:
        raise BundleError(f"member {member.name!r} cannot be read")
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def check_checksums(tar: tarfile.TarFile, files: dict[str, tarfile.TarInfo], top: str) -> None:
    """Every file is listed in SHA256SUMS with its digest, and every listed file exists."""
    listing = files.get(f"{top}/{CHECKSUMS}")
    if listing is None:
        raise BundleError(f"bundle has no {top}/{CHECKSUMS}")
    expected: dict[str, str] = {}
    for number, line in enumerate(_read(tar, listing).decode().splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64:
            raise BundleError(f"{CHECKSUMS} line {number} is not '<sha256>  <path>': {line!r}")
        expected[f"{top}/{name}"] = digest
    present = set(files) - {listing.name}
    problems = [f"{name}: not in {CHECKSUMS}" for name in sorted(present - set(expected))]
    problems += [f"{name}: listed in {CHECKSUMS} but missing" for name in sorted(set(expected) - present)]
    problems += [f"{name}: checksum mismatch" for name in sorted(present & set(expected))
                 if _sha256(tar, files[name]) != expected[name]]
    if problems:
        raise BundleError("bundle checksums do not hold:\n  " + "\n  ".join(problems))


def compare_tables(folder: Path) -> int:
    """Recompute the tables from the raw records below `folder` and compare; returns the run count."""
    try:
        workloads = load_workloads(sorted((folder / "concurrent").glob("*/concurrent.json")))
        tables = build_tables(load_records([folder / "runs"], folder / "plans"), workloads)
    except ConfigError as exc:
        raise BundleError(f"the raw records do not aggregate: {exc}") from exc
    stored = folder / "tables"
    for name in TABLE_FILES:
        if not (stored / name).is_file():
            raise BundleError(f"bundle lacks tables/{name}")
    for name, frame in (("runs.parquet", tables.runs), ("speedups.parquet", tables.speedups),
                        ("concurrent.parquet", tables.concurrent)):
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(stored / name), frame, check_exact=True)
        except AssertionError as exc:
            raise BundleError(f"tables/{name} differs from the table recomputed from the raw records: {exc}") from exc
    if (stored / "summary.md").read_text() != tables.summary:
        raise BundleError("tables/summary.md differs from the summary recomputed from the raw records")
    return len(tables.runs)


def verify_bundle(path: Path) -> Verified:
    """Check a bundle's member safety, checksums and tables; raises :class:`BundleError` on any failure."""
    try:
        tar = tarfile.open(path, "r:gz")
    except (OSError, tarfile.TarError) as exc:
        raise BundleError(f"{path} is not a readable tar.gz bundle: {exc}") from exc
    with tar:
        try:
            members = tar.getmembers()
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise BundleError(f"{path} is truncated or corrupt: {exc}") from exc
        top = check_members(members)
        files = {m.name: m for m in members if m.isfile()}
        check_checksums(tar, files, top)
        with tempfile.TemporaryDirectory(prefix="ralp-verify-") as scratch:
            for name, member in files.items():
                target = Path(scratch, name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(_read(tar, member))
            runs = compare_tables(Path(scratch, top))
    return Verified(top=top, files=len(files), runs=runs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe verify`."""
    parser.add_argument("bundle", type=Path, help="bundle (.tar.gz) written by `ralp-pipe bundle`")


def main(args: argparse.Namespace) -> int:
    """Verify one bundle; exit status 1 and the reason when it does not hold."""
    try:
        result = verify_bundle(args.bundle)
    except BundleError as exc:
        print(f"ralp-pipe verify: {args.bundle}: REFUSED: {exc}")
        return 1
    print(f"ralp-pipe verify: {args.bundle}: OK ({result.files} files, {result.runs} runs, tables recomputed)")
    return 0
