"""`ralp-pipe verify BUNDLE`: refuse unsafe or tampered bundles, then recompute the tables and compare.

Order matters: every member header is checked (declared sizes within :class:`Limits`, no
absolute or `..` paths, no links, devices or other special files, one top folder, no duplicates,
no file that is also another member's folder) before any content is read; contents are only
ever streamed in chunks with ``extractfile`` into a private temporary folder (never extracted by
tarfile itself, never held whole in memory), hashed on the way, and checked to be what their
names say (JSON objects, UTF-8 text, readable Parquet) before the tables are recomputed.

Each run's own figures must follow from its step records first (:func:`check_record`, by the
definitions of :mod:`ralp_pipe.engine.metrics`): images/sec, step time, images per step and GB/step
are recomputed from steps.parquet and the measured window, which must hold rank 0's measured steps,
and every step's compute from its time and waits. Tables and summary.md must equal what the raw
records recompute to. Plots are redrawn from the
recomputed runs table and compared byte for byte (PNG output is deterministic for one set of
drawing packages, see tests/test_bundle_reproducible.py) when the bundle's environment.json
names the same versions of :data:`DRAWING_PACKAGES` as this interpreter has; a bundle drawn with
other versions cannot be compared that way, and the result says its plots were not redrawn.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import re
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ralp_pipe.contract.layout import CONCURRENT_FILE, MEASURED_PLANS_FOLDER, PLOT_NAMES, PLOTS_FOLDER, TABLE_FILES
from ralp_pipe.contract.topology import WORKER
from ralp_pipe.engine.metrics import (
    MEASURE,
    compute_time,
    measured_overruns,
    measured_stalls,
    summarize,
    target_equivalent,
)
from ralp_pipe.engine.volume import CATEGORIES
from ralp_pipe.errors import BundleRefused, ConfigError, DataError
from ralp_pipe.results.aggregate import build_tables, load_plans, load_records, load_workloads
from ralp_pipe.results.bundle import CHECKSUMS, ENVIRONMENT
from ralp_pipe.results.tables import RunInput, Tables
from ralp_pipe.runtime.wire import wire_total

CHUNK = 1 << 20
TEXT_SUFFIXES = (".md", ".txt", ".lock")
_UNREADABLE = (OSError, EOFError, tarfile.TarError, zlib.error)  # what a cut or corrupt tar.gz raises when read
_SIZE = re.compile(r"^(\d+)([KMGT]?)$")
DRAWING_PACKAGES = ("matplotlib", "pillow", "numpy", "fonttools")  # what draws and encodes the PNGs
REL_TOLERANCE = 1e-9  # a figure recomputed from its step records equals the recorded one up to float rounding
NOT_REDRAWN = "not asked to"  # why a verification told not to redraw the plots did not


@dataclass(frozen=True)
class Limits:
    """How large a bundle may inflate: its members' declared sizes together may not exceed
    max(expand_ratio x the bundle's size, floor_bytes), nor max_bytes, nor the scratch folder's free space."""

    expand_ratio: float = 100.0  # JSON, Parquet and PNG results compress 3-10x; a tar bomb 1000x
    floor_bytes: int = 64 << 20  # small bundles of text may compress well beyond the ratio
    max_bytes: int = 16 << 30

    def allowed(self, compressed: int) -> int:
        """The most bytes a bundle of `compressed` bytes may declare (before the free-space check)."""
        return min(max(int(self.expand_ratio * compressed), self.floor_bytes), self.max_bytes)


@dataclass
class Verified:
    """What a successful verification checked, and the tables it recomputed (equal to the bundle's)."""

    top: str
    files: int
    tables: Tables
    plots_redrawn: str | None  # None: every plot equals the one redrawn from the tables; else why none was redrawn

    @property
    def runs(self) -> int:
        """How many runs the bundle holds."""
        return len(self.tables.runs)


def read_headers(tar: tarfile.TarFile, path: Path, limits: Limits, scratch: Path) -> list[tarfile.TarInfo]:
    """All member headers, refusing as soon as the declared sizes outgrow `limits` or `scratch`'s free space.

    Only headers are read: the data of the member that crosses the bound is never inflated.
    """
    compressed = path.stat().st_size
    allowed = limits.allowed(compressed)
    free = shutil.disk_usage(scratch).free
    total = 0
    try:
        while (member := tar.next()) is not None:
            total += member.size
            if total > allowed:
                raise BundleRefused(
                    f"member {member.name!r} declares {member.size} bytes, bringing the bundle to {total} bytes "
                    f"unpacked, over the limit of {allowed} for a {compressed}-byte bundle (ratio "
                    f"{limits.expand_ratio:g}, floor {limits.floor_bytes}, cap {limits.max_bytes}): a tar bomb? "
                    f"if the bundle is trusted, raise --max-expand-ratio, --expand-floor or --max-bytes"
                )
            if total > free:
                raise BundleRefused(
                    f"member {member.name!r} brings the bundle to {total} bytes unpacked, more than "
                    f"the {free} bytes free in {scratch}: free space there or set TMPDIR elsewhere"
                )
    except _UNREADABLE as exc:
        raise BundleRefused(f"{path} is truncated or corrupt: {exc}") from exc
    return tar.members  # type: ignore[attr-defined]  # filled by the complete read above


def check_members(members: list[tarfile.TarInfo]) -> str:
    """Refuse unsafe member headers; returns the single top folder name."""
    seen: set[str] = set()
    tops: set[str] = set()
    for member in members:
        name = member.name
        path = PurePosixPath(name)
        if not name or name.startswith("/") or "\\" in name or path.is_absolute():
            raise BundleRefused(f"member {name!r} has an absolute or non-POSIX path")
        if any(part in ("..", "") for part in name.rstrip("/").split("/")):
            raise BundleRefused(f"member {name!r} leaves the bundle folder ('..' or empty path parts)")
        if member.issym() or member.islnk():
            raise BundleRefused(f"member {name!r} is a link (to {member.linkname!r}); bundles hold only plain files")
        if not (member.isfile() or member.isdir()):
            raise BundleRefused(f"member {name!r} is a device, fifo or other special file")
        if name in seen:
            raise BundleRefused(f"member {name!r} appears twice")
        seen.add(name)
        tops.add(path.parts[0])
    if len(tops) != 1:
        raise BundleRefused(f"a bundle has exactly one top folder; found {sorted(tops) or 'none'}")
    files = {m.name for m in members if m.isfile()}
    for member in members:
        clash = next((str(p) for p in PurePosixPath(member.name).parents if str(p) in files), None)
        if clash is not None:
            raise BundleRefused(f"member {clash!r} is a file, but member {member.name!r} is inside it as a folder")
    return tops.pop()


def copy_out(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> str:
    """Stream one member's bytes to `target` in chunks; returns their sha256."""
    digest = hashlib.sha256()
    handle = tar.extractfile(member)
    if handle is None:
        raise BundleRefused(f"member {member.name!r} cannot be read")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with handle, open(target, "wb") as out:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except _UNREADABLE as exc:
        raise BundleRefused(f"member {member.name!r} cannot be read whole: {exc}") from exc
    return digest.hexdigest()


def check_checksums(digests: dict[str, str], listing: Path, top: str) -> None:
    """Every file is listed in SHA256SUMS (`listing`) with its digest, and every listed file exists."""
    name_of_listing = f"{top}/{CHECKSUMS}"
    if name_of_listing not in digests:
        raise BundleRefused(f"bundle has no {name_of_listing}")
    expected: dict[str, str] = {}
    with open(listing, encoding="utf-8", errors="replace", newline="\n") as lines:
        for number, line in enumerate(lines, 1):
            digest, sep, name = line.rstrip("\n").partition("  ")
            if not sep or len(digest) != 64:
                raise BundleRefused(f"{CHECKSUMS} line {number} is not '<sha256>  <path>': {line[:200]!r}")
            expected[f"{top}/{name}"] = digest
    present = set(digests) - {name_of_listing}
    problems = [f"{name}: not in {CHECKSUMS}" for name in sorted(present - set(expected))]
    problems += [f"{name}: listed in {CHECKSUMS} but missing" for name in sorted(set(expected) - present)]
    problems += [
        f"{name}: checksum mismatch" for name in sorted(present & set(expected)) if digests[name] != expected[name]
    ]
    if problems:
        raise BundleRefused(f"bundle checksums do not hold: {'; '.join(problems)}")


def check_contents(scratch: Path, names: list[str]) -> None:
    """Refuse members whose contents are not what their name says: JSON objects, UTF-8 text, readable Parquet."""
    for name in names:
        path = scratch / name
        if name.endswith(".json"):
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise BundleRefused(f"member {name!r} is not UTF-8 JSON: {exc}") from None
            if not isinstance(document, dict):
                raise BundleRefused(f"member {name!r} holds a JSON {type(document).__name__}, not an object")
        elif name.endswith(TEXT_SUFFIXES):
            _check_text(path, name)
        elif name.endswith(".parquet"):
            try:
                for _ in pq.ParquetFile(path).iter_batches():
                    pass
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise BundleRefused(f"member {name!r} is not a readable Parquet file: {exc}") from None


def _check_text(path: Path, name: str) -> None:
    """Refuse a text member that is not UTF-8 or holds NUL bytes (read in chunks)."""
    try:
        with open(path, encoding="utf-8") as text:
            while chunk := text.read(CHUNK):
                if "\0" in chunk:
                    raise BundleRefused(f"member {name!r} is binary (NUL bytes), not text")
    except UnicodeDecodeError as exc:
        raise BundleRefused(f"member {name!r} is not UTF-8 text: {exc}") from None


def _forged(
    run: RunInput, field: str, recorded: Any, recomputed: Any, source: str = "its step records"
) -> BundleRefused:
    """The refusal of a recorded figure that `source` does not give (`recomputed`: a value or a phrase)."""
    given = recomputed if isinstance(recomputed, str) else repr(recomputed)
    return BundleRefused(
        f"run {run.record.run}: metrics.json records {field}={recorded!r}, but {source} give {given}: "
        f"the record or its steps.parquet was changed after the run"
    )


def _close(recorded: Any, recomputed: float) -> bool:
    return isinstance(recorded, int | float) and math.isclose(recorded, recomputed, rel_tol=REL_TOLERANCE)


def check_record(run: RunInput) -> None:
    """Refuse a run whose metrics.json figures do not follow from its steps.parquet and measured window.

    images/sec, images per step (and the global batch), step time and GB/step by category are
    recomputed with :func:`ralp_pipe.engine.metrics.summarize`, the workers counted from the step
    records; the window (rank 0's clock) must be at least rank 0's measured steps, which it holds;
    every step's compute must be what its waits leave of it (:func:`ralp_pipe.engine.metrics.compute_time`);
    the wire GB/step must be what its hosts' link counters sent (:func:`ralp_pipe.runtime.wire.wire_total`).
    """
    record, steps = run.record, run.steps
    needed = ["rank", "compute_s", "comm_wait_s", *(f"bytes_{name}" for name in CATEGORIES)]
    missing = [column for column in needed if column not in steps]
    if missing:
        raise BundleRefused(
            f"run {record.run}: steps.parquet lacks column {', '.join(map(repr, missing))}, so its figures cannot "
            "be recomputed"
        )
    window = record.window_s if record.window_s is not None else record.step_time_s * record.measure_steps
    measured = steps[steps["phase"] == MEASURE]
    workers = int(measured.loc[measured["role"] == WORKER, "rank"].nunique())
    if record.workers != workers:
        raise _forged(run, "workers", record.workers, workers)
    if not (isinstance(window, int | float) and window > 0):
        raise _forged(run, "window_s", window, "a positive number of seconds")
    try:
        figures = summarize(steps.to_dict("records"), window, workers, record.batch_size, record.measure_steps)
    except ValueError as exc:
        raise BundleRefused(f"run {record.run}: {exc}") from None
    recomputed = {
        "images_per_sec": figures.images_per_sec,
        "images_per_step": figures.images_per_step,
        "global_batch": figures.images_per_step,
        "step_time_s": figures.step_time_s,
    }
    for field, value in recomputed.items():
        if not _close(getattr(record, field), value):
            raise _forged(run, field, getattr(record, field), value)
    recorded_gb = record.gb_per_step or {}
    for category in sorted(set(figures.gb_per_step) | set(recorded_gb)):
        value = figures.gb_per_step.get(category, math.nan)
        if not _close(recorded_gb.get(category), value):
            raise _forged(run, f"gb_per_step.{category}", recorded_gb.get(category), value)
    if record.wire_per_host is not None:
        wire = wire_total(record.wire_per_host)
        if not _close(record.wire_gb_per_step, wire):
            raise _forged(run, "wire_gb_per_step", record.wire_gb_per_step, wire, "its hosts' link counters")
    _check_dilation(run, figures.images_per_sec, steps)
    in_window = float(measured.loc[measured["rank"] == 0, "step_time_s"].sum())
    if in_window > window * (1 + REL_TOLERANCE):
        raise _forged(run, "window_s", window, f"at least {in_window!r} (rank 0's measured steps, inside the window)")
    data_wait = steps.get("data_wait_s", pd.Series(0.0, index=steps.index))  # older records: inside compute
    for row, wait in zip(steps.itertuples(index=False), data_wait):
        compute = compute_time(row.step_time_s, row.comm_wait_s, wait)
        if not _close(row.compute_s, compute):
            raise BundleRefused(
                f"run {record.run}: steps.parquet records compute_s={row.compute_s!r} for rank {row.rank} step "
                f"{row.step}, but its step time and waits give {compute!r}: the step records were changed"
            )


def _check_dilation(run: RunInput, images_per_sec: float, steps: pd.DataFrame) -> None:
    """A dilated run's target-equivalent images/sec must be the recomputed images/sec x its factor, and its
    overruns and stalls those of its measured step records; an undilated run has neither."""
    record = run.record
    factor = (record.dilation or {}).get("factor")
    wanted = target_equivalent(images_per_sec, factor)
    if wanted is None and record.target_images_per_sec is not None:
        raise _forged(run, "target_images_per_sec", record.target_images_per_sec, "None (the run is not dilated)")
    if wanted is not None and not _close(record.target_images_per_sec, wanted):
        raise _forged(run, "target_images_per_sec", record.target_images_per_sec, wanted)
    if record.dilation is not None:
        rows = steps.to_dict("records")
        for key, counted in (("overruns", measured_overruns(rows)), ("stalls", measured_stalls(rows))):
            if record.dilation.get(key, 0) != counted:
                raise _forged(run, f"dilation.{key}", record.dilation.get(key), counted)


def compare_tables(folder: Path) -> Tables:
    """Check every raw record below `folder` against its steps, recompute the tables from them and compare
    with the stored ones; return them. The plans are those the bundle holds: none where it has no plans
    folder (runs aggregated without plans have no predictions, and neither do the recomputed tables)."""
    plans = [folder / "plans"] if (folder / "plans").is_dir() else []
    try:
        workloads = load_workloads(sorted((folder / "concurrent").glob(f"*/{CONCURRENT_FILE}")))
        records = load_records([folder / "runs"], plans)
        measured = folder / MEASURED_PLANS_FOLDER  # experiment.measured_profiles' plans, where the bundle has them
        measured_plans = load_plans([measured]) if measured.is_dir() else {}
    except (ConfigError, DataError) as exc:
        raise BundleRefused(f"the raw records do not aggregate: {exc}") from exc
    for run in records:
        check_record(run)
    try:
        tables = build_tables(records, workloads, measured_plans)
    except (ConfigError, DataError) as exc:
        raise BundleRefused(f"the raw records do not aggregate: {exc}") from exc
    stored = folder / "tables"
    for name in TABLE_FILES:
        if not (stored / name).is_file():
            raise BundleRefused(f"bundle lacks tables/{name}")
    for name, frame in tables.frames().items():
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(stored / name), frame, check_exact=True)
        except AssertionError as exc:
            difference = " ".join(str(exc).split())  # pandas' report spans lines; a refusal is one
            raise BundleRefused(
                f"tables/{name} differs from the table recomputed from the raw records: {difference}"
            ) from exc
    if (stored / "summary.md").read_text() != tables.summary:
        raise BundleRefused("tables/summary.md differs from the summary recomputed from the raw records")
    return tables


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def compare_plots(folder: Path, tables: Tables) -> str | None:
    """Redraw every plot from the recomputed `tables` and compare bytes with tables/plots/ below `folder`.

    Returns None when all were compared, else the reason none were: the bundle names other
    versions of the drawing packages than this interpreter has (their PNG bytes differ legitimately).
    """
    from ralp_pipe.results.plots import write_plots  # matplotlib: only once the tables held

    stored = folder / "tables" / PLOTS_FOLDER
    missing = [f"tables/{PLOTS_FOLDER}/{name}.png" for name in PLOT_NAMES if not (stored / f"{name}.png").is_file()]
    if missing:
        raise BundleRefused(f"bundle lacks {', '.join(missing)}")
    described = folder / ENVIRONMENT
    packages = json.loads(described.read_text()).get("packages") if described.is_file() else None
    if not isinstance(packages, dict):
        return f"{ENVIRONMENT} names no package versions"
    lower = {str(name).lower(): version for name, version in packages.items()}
    bundled = {name: lower.get(name) for name in DRAWING_PACKAGES}
    here = {name: _installed(name) for name in DRAWING_PACKAGES}
    if bundled != here:
        differ = ", ".join(f"{n} {bundled[n]} (here {here[n]})" for n in DRAWING_PACKAGES if bundled[n] != here[n])
        return f"drawn with {differ}"
    with tempfile.TemporaryDirectory(prefix="redrawn-", dir=folder.parent) as redraw:
        for path in write_plots(tables, Path(redraw)):
            if path.read_bytes() != (stored / path.name).read_bytes():
                raise BundleRefused(
                    f"tables/{PLOTS_FOLDER}/{path.name} differs from the plot redrawn from the recomputed tables "
                    f"(same {', '.join(DRAWING_PACKAGES)} versions)"
                )
    return None


def verify_bundle(path: Path, limits: Limits = Limits(), redraw: bool = True) -> Verified:
    """Check a bundle's size, member safety, checksums, contents and tables, and its plots where `redraw`;
    raises BundleRefused on any failure."""
    scratch_parent = Path(tempfile.gettempdir())
    try:
        tar = tarfile.open(path, "r:gz")
    except _UNREADABLE as exc:
        raise BundleRefused(f"{path} is not a readable tar.gz bundle: {exc}") from exc
    with tar:
        members = read_headers(tar, path, limits, scratch_parent)
        top = check_members(members)
        files = [m for m in members if m.isfile()]
        with tempfile.TemporaryDirectory(prefix="ralp-verify-", dir=scratch_parent) as scratch:
            digests = {m.name: copy_out(tar, m, Path(scratch, m.name)) for m in files}
            check_checksums(digests, Path(scratch, top, CHECKSUMS), top)
            check_contents(Path(scratch), sorted(digests))
            tables = compare_tables(Path(scratch, top))
            plots = compare_plots(Path(scratch, top), tables) if redraw else NOT_REDRAWN
    return Verified(top=top, files=len(files), tables=tables, plots_redrawn=plots)


def byte_size(text: str) -> int:
    """A byte count like 1048576, 512K, 64M, 16G or 1T (powers of 1024), for command-line options."""
    match = _SIZE.match(text.strip().upper())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1048576, 512K, 64M or 16G")
    return int(match[1]) << (10 * "_KMGT".index(match[2] or "_"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe verify`."""
    default = Limits()
    parser.add_argument("bundle", type=Path, help="bundle (.tar.gz) written by `ralp-pipe bundle`")
    parser.add_argument(
        "--max-expand-ratio",
        type=float,
        default=default.expand_ratio,
        metavar="RATIO",
        help="refuse a bundle whose members declare more than RATIO x its size in bytes, "
        f"once above --expand-floor (default {default.expand_ratio:g})",
    )
    parser.add_argument(
        "--expand-floor",
        type=byte_size,
        default=default.floor_bytes,
        metavar="SIZE",
        help=f"unpacked size always allowed whatever the ratio (default {default.floor_bytes >> 20}M)",
    )
    parser.add_argument(
        "--max-bytes",
        type=byte_size,
        default=default.max_bytes,
        metavar="SIZE",
        help=f"refuse a bundle whose members declare more than SIZE in all (default "
        f"{default.max_bytes >> 30}G); bundles are also refused when larger than the free "
        "space of the temporary folder ($TMPDIR) they are checked in",
    )


def main(args: argparse.Namespace) -> int:
    """Verify one bundle; a BundleRefused (exit status 1) names the reason when it does not hold."""
    limits = Limits(expand_ratio=args.max_expand_ratio, floor_bytes=args.expand_floor, max_bytes=args.max_bytes)
    try:
        result = verify_bundle(args.bundle, limits)
    except BundleRefused as exc:
        raise BundleRefused(f"{args.bundle}: {exc}") from None
    plots = "plots redrawn" if result.plots_redrawn is None else f"plots NOT redrawn: {result.plots_redrawn}"
    print(f"ralp-pipe verify: {args.bundle}: OK ({result.files} files, {result.runs} runs, tables recomputed, {plots})")
    return 0
