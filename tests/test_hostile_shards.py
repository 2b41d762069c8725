"""Damaged shards: cut short before a run, cut short while its ranks start, changed in place, recorded without
checksums. Each is one line naming the shard and the command that rebuilds it; prepare-shards rebuilds only it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralp_pipe.cli import main as cli
from ralp_pipe.config import load
from ralp_pipe.data.shards import check_shards, output_dir, read_manifest
from ralp_pipe.errors import DataError
from support.small_run import small

# 3 classes of 8 small images in shards of 8: three shards, prepared in a second or two
DATASET = [
    "dataset=synthetic1k",
    "dataset.num_classes=3",
    "dataset.synthetic.images_per_class=8",
    "dataset.synthetic.height=24",
    "dataset.synthetic.width=24",
    "dataset.shards.images_per_shard=8",
]
CUT = "shard-000001.tar"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with the shards of :data:`DATASET`, prepared through the CLI once (do not change it)."""
    root = tmp_path_factory.mktemp("prepared") / "results"
    assert cli(["prepare-shards", "--no-progress", *DATASET, f"paths.results={root}"]) == 0
    return root


@pytest.fixture
def results(prepared: Path, tmp_path: Path) -> Path:
    """This test's own copy of :func:`prepared` (its tests damage the shards)."""
    return Path(shutil.copytree(prepared, tmp_path / "results"))


def shards_of(results: Path) -> Path:
    return output_dir(load([*DATASET, f"paths.results={results}"]))


def cut_short(shard: Path) -> int:
    """Truncate `shard` to half its size; return the size it had."""
    size = shard.stat().st_size
    os.truncate(shard, size // 2)
    return size


def damaged_line(stderr: str, stage: str = "train") -> str:
    """The one stderr line of a run refused for a damaged shard (exit 3), checked to be traceback-free."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr and "gloo" not in stderr, stderr
    assert lines[0].startswith(f"ralp-pipe {stage}: data error: "), stderr
    return lines[0]


def advised_command(line: str) -> list[str]:
    """The `ralp-pipe prepare-shards ...` command a refusal advises, as an argv without the program."""
    match = re.search(r"`(ralp-pipe prepare-shards [^`]*)`", line)
    assert match, line
    return shlex.split(match[1])[1:]


def train(out: Path, results: Path, *options: str) -> subprocess.Popen[str]:
    """`ralp-pipe train` of the small model reading :data:`DATASET`'s shards through DALI, in a subprocess."""
    overrides = small("train.loader=dali", "train.measure_steps=3", *DATASET, f"paths.results={results}")
    return subprocess.Popen(
        [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *options, *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # a `ralp-pipe train` subprocess (it imports torch before it refuses)
def test_a_shard_cut_short_is_named_before_any_rank_starts_and_the_advised_command_rebuilds_it(
    results: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    shards = shards_of(results)
    size = cut_short(shards / CUT)
    proc = train(results.parent / "runs" / "run", results)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr
    line = damaged_line(stderr)
    assert f"shard {shards / CUT} is damaged: it has {size // 2} bytes where {size} were written" in line, line
    assert "rank" not in stdout, "ranks were started"
    assert not (results.parent / "runs").exists() or not list((results.parent / "runs").iterdir())

    others = {p.name: p.stat().st_mtime_ns for p in shards.glob("shard-*.tar") if p.name != CUT}
    capfd.readouterr()
    assert cli(advised_command(line)) == 0
    assert f"{shards / CUT} is damaged (it has {size // 2} bytes where {size} were written): rebuilding it" in (
        capfd.readouterr().err
    )
    assert (shards / CUT).stat().st_size == size
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("shard-*.tar") if p.name != CUT} == others
    check_shards(shards, load([*DATASET, f"paths.results={results}"]), hashed=True)


@pytest.mark.slow  # a `ralp-pipe train` subprocess with 3 ranks
def test_a_shard_cut_short_while_the_ranks_start_is_named_and_their_logs_kept(results: Path) -> None:
    shards, runs = shards_of(results), results.parent / "runs"
    proc = train(runs / "run", results)
    deadline = time.monotonic() + 120
    while not list(runs.glob(".run.ranks-*/rank*.log")):  # the driver's check passed: the ranks are starting
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    size = cut_short(shards / CUT)  # before DALI reads the indexes: the ranks import torch first
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr
    line = damaged_line(stderr)
    assert line.startswith(f"ralp-pipe train: data error: a rank failed reading the shards: shard {shards / CUT} ")
    assert f"it has {size // 2} bytes where {size} were written" in line and "`ralp-pipe prepare-shards " in line
    kept = Path(line.rpartition("the ranks' logs are kept in ")[2])
    try:
        logs = "".join(p.read_text(errors="replace") for p in kept.glob("rank*.log"))
        assert "Traceback" in logs and CUT.removesuffix(".tar") in logs, "the ranks' own errors were not kept"
    finally:
        for log in kept.iterdir():
            log.unlink()
        kept.rmdir()
    assert list(runs.iterdir()) == [], "the failed run left its staging folder or a record"


@pytest.mark.slow
def test_a_shard_changed_in_place_is_found_by_its_checksum(results: Path) -> None:
    shards, cfg = shards_of(results), load([*DATASET, f"paths.results={results}"])
    data = bytearray((shards / CUT).read_bytes())
    data[600] ^= 0xFF  # inside the first image: same size
    (shards / CUT).write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"shard {shards / CUT} is damaged: the sha256 of {CUT} differs"):
        check_shards(shards, cfg)  # 3 small shards: hashed before every run
    check_shards(shards, cfg, hashed=False)  # sized only, as shards over the hashing limit are


@pytest.mark.slow
def test_the_advised_command_carries_the_dataset_keys_and_results_folder_of_the_run(results: Path) -> None:
    """The command names every dataset key the run changed, so it re-plans nothing and rebuilds only the shard."""
    shards = shards_of(results)
    (shards / "shard-000002.idx").unlink()
    with pytest.raises(DataError) as refused:
        check_shards(shards, load([*DATASET, f"paths.results={results}"]))
    line = str(refused.value)
    assert f"shard {shards / 'shard-000002.tar'} is damaged: cannot read it: {shards / 'shard-000002.idx'}: " in line
    assert advised_command(line) == ["prepare-shards", *DATASET, f"paths.results={results}"]
    intact = {p.name: p.stat().st_mtime_ns for p in shards.glob("shard-00000[01].tar")}
    assert cli([*advised_command(line), "--no-progress"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("shard-00000[01].tar")} == intact, "re-planned"
    assert (shards / "shard-000002.idx").is_file()


@pytest.mark.slow
def test_shards_given_elsewhere_are_advised_to_be_deleted_and_prepared_anew(results: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shards_of(results).rename(moved)
    cut_short(moved / CUT)
    with pytest.raises(DataError, match=f"delete {moved} and prepare the shards anew"):
        check_shards(moved, load([*DATASET, f"paths.results={results}"]))


def test_a_manifest_without_sizes_and_checksums_is_refused_saying_so(results: Path) -> None:
    shards = shards_of(results)
    manifest = read_manifest(shards)
    for entry in manifest["shards"]:
        del entry["sha256"]
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="no bytes and sha256 and index_sha256 are recorded for it .*older ralp-pipe"):
        check_shards(shards, load([*DATASET, f"paths.results={results}"]))


def test_an_unreadable_manifest_is_named(results: Path) -> None:
    shards = shards_of(results)
    (shards / "manifest.json").write_text('{"shards": [')
    with pytest.raises(DataError, match=f"{shards / 'manifest.json'} cannot be read .*delete {shards} and prepare"):
        check_shards(shards, load([*DATASET, f"paths.results={results}"]))
