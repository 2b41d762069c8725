"""`ralp-pipe prepare-shards`: pack an image collection into webdataset tar shards with DALI indexes.

Output under `<paths.results>/data/<dataset>/`: `shard-NNNNNN.tar` + `shard-NNNNNN.idx`,
`classes.json` (synset -> label), `manifest.json` (counts, checksums, options, versions,
skipped files) and `parts/shard-NNNNNN.json`, the record of each finished shard. Images are
assigned to shards by a fixed plan (sorted, shuffled with a constant seed, chunked), and each
planned shard has a fingerprint of its inputs and options; a shard whose record carries the
same fingerprint and whose files still match their checksums is kept, so an interrupted run
resumes and a re-run on unchanged input rewrites nothing.

One run at a time prepares an output folder: it holds an exclusive lock on `.prepare.lock` in
it (holding the run's PID) for the whole prepare; a second run waits for it, then gives up.

Training checks the shards it will read against the manifest before any rank starts
(:func:`check_shards`): every shard's size, and the sha256 of every shard and index where the
shards total at most :data:`HASH_LIMIT_BYTES` (the default's 12 MB hash in 20-30 ms; a full
ImageNet's tens of GB would take about a minute per run, so those are sized only). A run that
fails while a shard is damaged (:func:`damage_named`) hashes them all to name it. Either way one
line names the shard and the `ralp-pipe prepare-shards` command that rebuilds it.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import Future, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Mapping

from tqdm import tqdm

from ralp_pipe.atomic import atomic_path, check_writable
from ralp_pipe.config import Config, DatasetConfig, load, to_dict
from ralp_pipe.contract.layout import MANIFEST_FILE, PATHS
from ralp_pipe.data import imaging, synthetic
from ralp_pipe.data.sources import Scan, SourceError, SourceImage, read_bytes, scan
from ralp_pipe.data.tarshard import Sample, index_text, tar_bytes
from ralp_pipe.errors import ConfigError, DataError, RunFailure, disk_errors, os_problem
from ralp_pipe.runtime.process import process_pool

CONFIG_KEYS = ("dataset", "paths")  # what this stage reads of the config (a key covers those below it)

FORMAT_VERSION = 1
SHUFFLE_SEED = 0
MANIFEST = MANIFEST_FILE
CLASSES = "classes.json"
RECORDS = "parts"
LOCK = ".prepare.lock"
LOCK_WAIT_S = 600.0
_SHARD_FILE = re.compile(r"^shard-\d{6}\.(tar|idx|json)$")
HASH_LIMIT_BYTES = 1 << 30  # shards totalling more are only sized before a run: hashing would take seconds or more
CHECKED = ("bytes", "sha256", "index_sha256")  # what a shard's record and manifest entry say of its files


@dataclass(frozen=True)
class PlannedShard:
    """One shard of the plan: its name, its (image, label, key) items and the fingerprint of its inputs."""

    name: str
    items: tuple[tuple[SourceImage, int, str], ...]
    fingerprint: str


def output_dir(cfg: Config) -> Path:
    """Where the shards of `cfg.dataset` live: `<paths.results>/data/<dataset.name>` (:data:`PATHS`)."""
    return Path(cfg.paths.results) / PATHS["shards"].format(dataset=cfg.dataset.name)


def read_manifest(shards_dir: Path) -> dict[str, Any]:
    """The manifest of prepared shards in `shards_dir`; fails with advice when there is none."""
    path = Path(shards_dir) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"no {MANIFEST} in {shards_dir}: run `ralp-pipe prepare-shards dataset=<name>` first")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} cannot be read ({exc}): delete {shards_dir} and prepare the shards anew") from exc
    return manifest


def check_shards(shards_dir: Path, cfg: Config, hashed: bool | None = None) -> None:
    """Refuse (DataError, one line) the first shard of `shards_dir` that differs from its manifest entry, naming
    it and the command that rebuilds it (:func:`rebuild_advice`); the checksums too where `hashed` (None: where
    the shards total at most :data:`HASH_LIMIT_BYTES`)."""
    entries = read_manifest(shards_dir)["shards"]
    if hashed is None:
        hashed = sum(entry.get("bytes", 0) for entry in entries) <= HASH_LIMIT_BYTES
    for entry in entries:
        tar = shards_dir / entry["name"]
        problem = shard_problem(tar, shards_dir / entry["index"], entry, hashed)
        if problem is not None:
            raise DataError(f"shard {tar} is damaged: {problem}; {rebuild_advice(shards_dir, cfg)}")


def shard_problem(tar: Path, idx: Path, expected: Mapping[str, Any], hashed: bool = True) -> str | None:
    """What differs between shard `tar` with its index `idx` and `expected` (its record or manifest entry), None
    where nothing does: the tar's size and the index's presence always, both checksums where `hashed`."""
    if any(key not in expected for key in CHECKED):
        return f"no {' and '.join(CHECKED)} are recorded for it (it was prepared by an older ralp-pipe)"
    try:
        size, _ = tar.stat().st_size, idx.stat()
        if size != expected["bytes"]:
            return f"it has {size} bytes where {expected['bytes']} were written"
        for path, key in ((tar, "sha256"), (idx, "index_sha256")):
            if hashed and _file_sha256(path) != expected[key]:
                return f"the sha256 of {path.name} differs from the one recorded when it was written"
    except OSError as exc:
        return f"cannot read it: {os_problem(exc)}"
    return None


@contextmanager
def damage_named(shards_dir: Path | None, cfg: Config, logs: Path) -> Iterator[None]:
    """Turn a run that failed (RunFailure) while a shard of `shards_dir` is damaged into one line naming the shard
    and the next step (:func:`check_shards`, hashing every shard), with the ranks' logs of `logs` copied to a
    folder it names; a failure with intact shards passes unchanged."""
    try:
        yield
    except RunFailure as failure:
        if shards_dir is None:
            raise
        try:
            check_shards(shards_dir, cfg, hashed=True)
        except (ConfigError, DataError) as damaged:
            raise DataError(f"a rank failed reading the shards: {damaged}; {_keep_logs(logs)}") from failure
        raise


def _keep_logs(logs: Path) -> str:
    """Copy the `*.log` files of `logs` (about to be removed) to a new temporary folder; say where they are."""
    try:
        kept = Path(tempfile.mkdtemp(prefix="ralp-pipe-rank-logs-"))
        for log in sorted(logs.glob("*.log")):
            shutil.copyfile(log, kept / log.name)
    except OSError as exc:
        return f"the ranks' logs could not be kept: {os_problem(exc)}"
    return f"the ranks' logs are kept in {kept}"


def rebuild_advice(shards_dir: Path, cfg: Config) -> str:
    """What to do about a damaged shard of `shards_dir`: the `prepare-shards` command of `cfg` (which rebuilds only
    the damaged shards) where it writes that folder, else deleting the folder and preparing it anew."""
    command = prepare_command(cfg)
    if shards_dir.resolve() == output_dir(cfg).resolve():
        return f"rebuild it with `{command}` (it keeps the intact shards) or delete {shards_dir} and prepare it anew"
    return f"delete {shards_dir} and prepare the shards anew (`{command}` writes them to {output_dir(cfg)})"


def prepare_command(cfg: Config) -> str:
    """The `ralp-pipe prepare-shards` command preparing `cfg`'s shards: its dataset (and source), the dataset keys
    that differ from that dataset's own settings and the results folder where it is not the default."""
    given = [f"dataset={cfg.dataset.name}"]
    if cfg.dataset.source is not None:
        given.append(f"dataset.source={cfg.dataset.source}")
    try:
        default = load(given)
    except ConfigError:  # not a dataset of config/, or its source is gone: prepare-shards will say which
        return shlex.join(["ralp-pipe", "prepare-shards", *given, f"paths.results={cfg.paths.results}"])
    overrides = given + _changed("dataset", to_dict(cfg)["dataset"], to_dict(default)["dataset"])
    if cfg.paths.results != default.paths.results:
        overrides.append(f"paths.results={cfg.paths.results}")
    return shlex.join(["ralp-pipe", "prepare-shards", *overrides])


def _changed(prefix: str, values: dict[str, Any], default: dict[str, Any]) -> list[str]:
    """Overrides `prefix.key=value` of every key of `values` whose value differs from `default`'s (nested keys too)."""
    overrides = []
    for key, value in values.items():
        if isinstance(value, dict):
            overrides += _changed(f"{prefix}.{key}", value, default.get(key) or {})
        elif value != default.get(key):
            text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            overrides.append(f"{prefix}.{key}={text}")
    return overrides


def prepare(cfg: Config, progress: bool = True, lock_wait_s: float = LOCK_WAIT_S) -> Path:
    """Build (or bring up to date) the shards of `cfg.dataset` and return their folder.

    Holds the output folder's lock throughout, waiting up to `lock_wait_s` for another run.
    """
    dataset, out = cfg.dataset, output_dir(cfg)
    with output_lock(out, lock_wait_s):
        source = _source_root(dataset, out)
        layout = "folders" if dataset.layout == "synthetic" else dataset.layout
        found = scan(source, layout)
        if len(found.synsets) > dataset.num_classes:
            raise SourceError(
                f"{source} holds {len(found.synsets)} classes but dataset.num_classes={dataset.num_classes}: "
                f"labels would not fit the model; raise dataset.num_classes or remove the extra class folders"
            )
        if dataset.shards.strict and found.damaged:
            raise SourceError(
                f"unreadable source data in {source}: {found.damaged[0]} "
                f"(dataset.shards.strict=true stops here; set it to false to skip and list it)"
            )
        if not found.images:
            raise _no_usable_images(source, layout, found.skipped)
        options = _content_options(dataset)
        plan = make_plan(found, options)
        (out / RECORDS).mkdir(exist_ok=True)
        _remove_leftovers(out, {shard.name for shard in plan})
        records = _build_all(plan, out, dataset, options, progress)
        if not any(record["images"] for record in records):
            (out / MANIFEST).unlink(missing_ok=True)  # it lists shards of an earlier source, removed just now
            raise _no_usable_images(source, layout, found.skipped + [i for r in records for i in r["skipped"]])
        _write_if_changed(out / CLASSES, _json({synset: label for label, synset in enumerate(found.synsets)}))
        _write_if_changed(out / MANIFEST, _json(_manifest(dataset, source, found, plan, records, options)))
    return out


@contextmanager
def output_lock(out: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the exclusive lock of the output folder `out` (its PID written in `out/.prepare.lock`).

    Another holder is waited for, with a message naming its PID, for at most `wait_s` seconds;
    then a DataError names it.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    deadline = time.monotonic() + wait_s
    announced = False
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = path.read_text().strip() or "unknown"
                if time.monotonic() >= deadline:
                    raise DataError(
                        f"{out} is being prepared by another run (PID {holder}, lock {path}); gave up after "
                        f"{wait_s:g} s: let that run finish or stop it, then run again"
                    ) from None
                if not announced:
                    print(
                        f"ralp-pipe prepare-shards: {out} is being prepared by PID {holder}; "
                        f"waiting up to {wait_s:g} s for it to finish",
                        file=sys.stderr,
                        flush=True,
                    )
                    announced = True
                time.sleep(0.1)
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)


def _no_usable_images(source: Path, layout: str, skipped: list[dict[str, str]]) -> DataError:
    """The error for a source that yields no image: what was found instead and what was expected."""
    expected = f"{source}/n01440764/*.JPEG" if layout == "folders" else f"{source}/n01440764.tar"
    if skipped:
        kinds = Counter(re.split(r"[:(]", item["reason"], maxsplit=1)[0].strip() for item in skipped)
        found = f"{len(skipped)} entries skipped ({', '.join(f'{n} {kind}' for kind, n in kinds.most_common())})"
    else:
        found = "it is empty"
    return DataError(f"0 usable images in {source}: {found}; expected {expected} (dataset.layout={layout})")


def make_plan(found: Scan, options: dict[str, Any]) -> list[PlannedShard]:
    """Deterministic assignment of images to shards: sorted, shuffled with a fixed seed, chunked."""
    labels = {synset: label for label, synset in enumerate(found.synsets)}
    keys = _unique_keys(found.images)
    items = [(image, labels[image.synset], key) for image, key in zip(found.images, keys)]
    random.Random(SHUFFLE_SEED).shuffle(items)
    size = options["images_per_shard"]
    plan = []
    for number, start in enumerate(range(0, len(items), size)):
        chunk = tuple(items[start : start + size])
        inputs = [[i.ref, i.size, i.mtime_ns, i.offset, label, key] for i, label, key in chunk]
        fingerprint = hashlib.sha256(_json({"options": options, "items": inputs}).encode()).hexdigest()
        plan.append(PlannedShard(f"shard-{number:06d}", chunk, fingerprint))
    return plan


def build_shard(out: Path, shard: PlannedShard, options: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Write one planned shard (tar, index, record) unless an identical finished one is there; return its record."""
    record_path = _record_path(out, shard.name)
    kept = _finished_record(out, shard, record_path)
    if kept is not None:
        return kept
    samples, skipped, counts, reencoded = [], [], Counter[str](), 0
    for image, label, key in shard.items:
        try:
            jpeg, changed = _usable_jpeg(image, options["resize_shorter"])
        except imaging.BadImage as exc:
            if strict:
                raise SourceError(
                    f"unusable source file {image.location()}: {exc} "
                    f"(dataset.shards.strict=true stops here; set it to false to skip and list such files)"
                ) from None
            skipped.append({"path": image.ref, "reason": str(exc)})
            continue
        samples.append(Sample(key, jpeg, f"{label:0{options['label_digits']}d}".encode()))
        counts[image.synset] += 1
        reencoded += changed
    record: dict[str, Any] = {
        "fingerprint": shard.fingerprint,
        "images": len(samples),
        "reencoded": reencoded,
        "classes": dict(sorted(counts.items())),
        "skipped": skipped,
    }
    for suffix in (".tar", ".idx"):
        (out / f"{shard.name}{suffix}").unlink(missing_ok=True)
    try:
        if samples:
            data = tar_bytes(samples)
            index = index_text(data).encode()
            _write(out / f"{shard.name}.tar", data)
            _write(out / f"{shard.name}.idx", index)
            record.update(bytes=len(data), sha256=_sha256(data), index_sha256=_sha256(index))
        _write(record_path, _json(record).encode())
    except OSError:  # a full disk between the tar and its record: a shard is finished with its record or absent
        for suffix in (".tar", ".idx"):
            (out / f"{shard.name}{suffix}").unlink(missing_ok=True)
        raise
    return record


def _source_root(dataset: DatasetConfig, out: Path) -> Path:
    """The folder to read: the configured source, or the generated synthetic collection."""
    if dataset.layout == "synthetic":
        workers = dataset.shards.workers
        return synthetic.generate(out / "source", dataset.num_classes, dataset.synthetic, workers)
    assert dataset.source is not None  # config validation requires it for real layouts
    return Path(dataset.source).resolve()


def _content_options(dataset: DatasetConfig) -> dict[str, Any]:
    """Every setting that changes shard bytes (a change re-plans and rebuilds the shards)."""
    return {
        "format": FORMAT_VERSION,
        "images_per_shard": dataset.shards.images_per_shard,
        "resize_shorter": dataset.shards.resize_shorter,
        "jpeg_quality": imaging.JPEG_QUALITY,
        "label_digits": len(str(dataset.num_classes - 1)),
        "shuffle_seed": SHUFFLE_SEED,
    }


def _unique_keys(images: list[SourceImage]) -> list[str]:
    """Webdataset keys from file names (no dots, synset prefix), made unique in scan order."""
    used: set[str] = set()
    keys = []
    for image in images:
        stem = image.ref.rpartition("/")[2].partition(".")[0]
        base = re.sub(r"[^A-Za-z0-9_-]", "_", stem)[:80]
        base = base if base.startswith(image.synset) else f"{image.synset}_{base}"
        key, copy = base, 1
        while key in used:
            copy += 1
            key = f"{base}_{copy}"
        used.add(key)
        keys.append(key)
    return keys


def _usable_jpeg(image: SourceImage, resize_shorter: int | None) -> tuple[bytes, bool]:
    """Read `image` and return its RGB JPEG bytes, raising BadImage with the reason when unusable."""
    try:
        data = read_bytes(image)
    except OSError as exc:
        raise imaging.BadImage(f"cannot read: {exc.strerror or exc}") from None
    if len(data) < image.size:
        raise imaging.BadImage(f"truncated: only {len(data)} of {image.size} bytes present")
    return imaging.to_rgb_jpeg(data, resize_shorter)


def _finished_record(out: Path, shard: PlannedShard, record_path: Path) -> dict[str, Any] | None:
    """The record of `shard` if it was finished with the same inputs and its files are intact."""
    try:
        record: dict[str, Any] = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("fingerprint") != shard.fingerprint:
        return None
    tar, idx = out / f"{shard.name}.tar", out / f"{shard.name}.idx"
    if not record["images"]:
        return None if tar.exists() or idx.exists() else record
    problem = shard_problem(tar, idx, record)
    if problem is not None:
        print(f"ralp-pipe prepare-shards: {tar} is damaged ({problem}): rebuilding it", file=sys.stderr, flush=True)
        return None
    return record


def _build_all(
    plan: list[PlannedShard], out: Path, dataset: DatasetConfig, options: dict[str, Any], progress: bool
) -> list[dict[str, Any]]:
    """Build every planned shard (in `dataset.shards.workers` processes) with a progress bar on stderr."""
    strict = dataset.shards.strict
    bar = tqdm(
        total=sum(len(s.items) for s in plan),
        unit="img",
        desc=f"shards {dataset.name}",
        disable=not progress,
        file=sys.stderr,
    )
    records: dict[str, dict[str, Any]] = {}
    with bar:
        if dataset.shards.workers == 1 or len(plan) < 2:
            for shard in plan:
                records[shard.name] = build_shard(out, shard, options, strict)
                bar.update(len(shard.items))
        else:
            try:
                with process_pool(min(dataset.shards.workers, len(plan))) as pool:
                    futures = {pool.submit(build_shard, out, s, options, strict): s for s in plan}
                    _collect(futures, records, bar)
            except BaseException:
                _remove_unfinished(out, plan)
                raise
    return [records[shard.name] for shard in plan]


def _collect(
    futures: dict[Future[dict[str, Any]], PlannedShard], records: dict[str, dict[str, Any]], bar: tqdm
) -> None:
    """Gather finished shards as they complete; the first failure is raised (the pool then drops the rest)."""
    for future in as_completed(futures):
        shard = futures[future]
        records[shard.name] = future.result()
        bar.update(len(shard.items))


def _record_path(out: Path, shard: str) -> Path:
    """Where shard `shard`'s record lies (written last: a shard with its record is finished)."""
    return out / RECORDS / f"{shard}.json"


def _remove_unfinished(out: Path, plan: list[PlannedShard]) -> None:
    """After the pool killed its workers, some maybe mid-write: delete their temporaries and any shard
    written without its record yet (this process holds the folder's lock, so all of them are ours)."""
    _remove_leftovers(out, {shard.name for shard in plan})
    for shard in plan:
        if not _record_path(out, shard.name).exists():
            for suffix in (".tar", ".idx"):
                (out / f"{shard.name}{suffix}").unlink(missing_ok=True)


def _remove_leftovers(out: Path, planned: set[str]) -> None:
    """Delete temporary files of interrupted runs and shards that are no longer in the plan."""
    for folder in (out, out / RECORDS):
        for path in folder.iterdir():
            temporary = path.name.startswith(".") and path.name.endswith(".tmp")
            stale = _SHARD_FILE.match(path.name) and path.name.rpartition(".")[0] not in planned
            if path.is_file() and (temporary or stale):
                path.unlink()


def _manifest(
    dataset: DatasetConfig,
    source: Path,
    found: Scan,
    plan: list[PlannedShard],
    records: list[dict[str, Any]],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The manifest: what was read, what was written (with checksums), what was skipped and why."""
    counts = Counter[str]()
    for record in records:
        counts.update(record["classes"])
    settings: dict[str, Any] = {**options, "strict": dataset.shards.strict}
    if dataset.layout == "synthetic":
        settings["synthetic"] = asdict(dataset.synthetic)
    shards = [
        {
            "name": f"{shard.name}.tar",
            "index": f"{shard.name}.idx",
            "images": r["images"],
            "reencoded": r["reencoded"],
            "bytes": r["bytes"],
            "sha256": r["sha256"],
            "index_sha256": r["index_sha256"],
        }
        for shard, r in zip(plan, records)
        if r["images"]
    ]
    return {
        "dataset": dataset.name,
        "layout": dataset.layout,
        "source": str(source.resolve()),
        "num_classes": dataset.num_classes,
        "classes_found": len(found.synsets),
        "images": sum(counts.values()),
        "options": settings,
        "counts_per_class": {synset: counts.get(synset, 0) for synset in found.synsets},
        "shards": shards,
        "skipped": found.skipped + [item for r in records for item in r["skipped"]],
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    """Versions of what determines the shard bytes."""
    from PIL import features

    names = ("ralp-pipe", "pillow", "numpy", "tqdm")
    found = {name: metadata.version(name) for name in names}
    return {**found, "libjpeg": str(features.version("jpg")), "python": platform.python_version()}


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _write(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _write_if_changed(path: Path, text: str) -> None:
    """Write `text` atomically unless the file already holds exactly it (keeps its mtime)."""
    data = text.encode()
    if not (path.is_file() and path.read_bytes() == data):
        _write(path, data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `ralp-pipe prepare-shards` (the dataset itself comes from Hydra overrides)."""
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--lock-wait",
        type=float,
        default=LOCK_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait for another run preparing the same folder (default {LOCK_WAIT_S:g})",
    )


def main(args: argparse.Namespace) -> int:
    """Prepare the shards of the configured dataset and print a one-line summary."""
    cfg = load(args.overrides)
    check_writable(output_dir(cfg), f"paths.results={cfg.paths.results}")
    advice = (
        "nothing half-written was left (finished shards are kept): free space there (or set paths.results "
        "elsewhere) and run prepare-shards again"
    )
    with disk_errors(f"the shards of {cfg.dataset.name}", output_dir(cfg), advice):
        out = prepare(cfg, progress=not args.no_progress, lock_wait_s=args.lock_wait)
    manifest = read_manifest(out)
    print(
        f"{manifest['images']} images of {manifest['classes_found']} classes in {len(manifest['shards'])} shards, "
        f"{len(manifest['skipped'])} entries skipped -> {out}"
    )
    return 0
