"""prepare-shards: round trip, ImageNet oddities, strict mode, resume and idempotent re-runs."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from conftest import encode, folders_to_tars, noise_image
from ralp_pipe import cli
from ralp_pipe.data.shards import LOCK, PlannedShard, _remove_unfinished, prepare, read_manifest
from ralp_pipe.data.sources import SourceError
from ralp_pipe.data.tarshard import read_index


def shard_contents(out: Path) -> list[tuple[str, bytes, int]]:
    """(key, jpeg bytes, label) of every sample of every shard listed in the manifest."""
    samples = []
    for shard in read_manifest(out)["shards"]:
        with tarfile.open(out / shard["name"]) as archive:
            files = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]
        for name in sorted(files):
            key, _, ext = name.partition(".")
            if ext == "jpg":
                samples.append((key, files[name], int(files[f"{key}.cls"])))
    return samples


def expected_samples(root: Path) -> Counter[tuple[bytes, int]]:
    """(bytes, label) of every image of an RGB class-folder tree, labels from sorted synsets."""
    synsets = sorted(p.name for p in root.iterdir())
    return Counter((f.read_bytes(), label) for label, s in enumerate(synsets) for f in (root / s).iterdir())


def mtimes(folder: Path) -> dict[str, int]:
    """mtime of every file below `folder` but the lock file, which each run writes its PID into."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and p.name != LOCK
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["folders", "tars"])
def test_every_image_lands_once_with_its_label(rgb_tree, make_config, tmp_path, layout):
    source = rgb_tree if layout == "folders" else folders_to_tars(rgb_tree, tmp_path / "tars")
    out = prepare(make_config(source, layout=layout), progress=False)
    stored = shard_contents(out)
    assert Counter((data, label) for _, data, label in stored) == expected_samples(rgb_tree)
    manifest = read_manifest(out)
    assert manifest["counts_per_class"] == {"n00000000": 2, "n00000001": 3, "n00000002": 4}
    assert [s["images"] for s in manifest["shards"]] == [3, 3, 3]
    assert json.loads((out / "classes.json").read_text()) == {"n00000000": 0, "n00000001": 1, "n00000002": 2}
    assert all(s["reencoded"] == 0 for s in manifest["shards"])
    assert manifest["skipped"] == []
    for shard in manifest["shards"]:
        index = read_index(out / shard["index"])
        assert len(index) == shard["images"] and all(set(sample) == {"jpg", "cls"} for sample in index)


def test_oddities_become_rgb_or_are_skipped_with_reasons(rgb_tree, make_config):
    odd = rgb_tree / "n00000003"
    odd.mkdir()
    good = encode(noise_image(99))
    (odd / "cmyk.JPEG").write_bytes(encode(noise_image(1, "CMYK")))
    (odd / "gray.JPEG").write_bytes(encode(noise_image(2, "L")))
    (odd / "png.JPEG").write_bytes(encode(noise_image(3), "PNG"))
    (odd / "truncated.JPEG").write_bytes(good[: len(good) // 2])
    (odd / "zero.JPEG").write_bytes(b"")
    (odd / "text.JPEG").write_text("<html>404 not found</html>")
    (odd / ".hidden.JPEG").write_bytes(good)
    (odd / "nested").mkdir()
    (rgb_tree / "stray_folder").mkdir()
    (rgb_tree / "LOC_synset_mapping.txt").write_text("n00000000 thing\n")
    (rgb_tree / ".DS_Store").write_bytes(b"\0\1")
    out = prepare(make_config(rgb_tree), progress=False)
    manifest = read_manifest(out)
    reasons = {item["path"]: item["reason"] for item in manifest["skipped"]}
    assert set(reasons) == {
        "n00000003/truncated.JPEG",
        "n00000003/zero.JPEG",
        "n00000003/text.JPEG",
        "n00000003/.hidden.JPEG",
        "n00000003/nested",
        "stray_folder",
        "LOC_synset_mapping.txt",
        ".DS_Store",
    }
    assert "truncated" in reasons["n00000003/truncated.JPEG"]
    assert "0 bytes" in reasons["n00000003/zero.JPEG"]
    assert "not an image" in reasons["n00000003/text.JPEG"]
    assert manifest["counts_per_class"]["n00000003"] == 3
    assert sum(s["reencoded"] for s in manifest["shards"]) == 3
    converted = [data for key, data, label in shard_contents(out) if label == 3]
    for data in converted:
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (40, 32))


def test_resize_shorter_shrinks_and_reencodes(rgb_tree, make_config):
    out = prepare(make_config(rgb_tree, "dataset.shards.resize_shorter=16"), progress=False)
    for _, data, _ in shard_contents(out):
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (20, 16))
    assert sum(s["reencoded"] for s in read_manifest(out)["shards"]) == 9


@pytest.mark.slow
def test_damaged_member_of_a_synset_tar_is_skipped(rgb_tree, make_config, tmp_path):
    (rgb_tree / "n00000001" / "n00000001_9.JPEG").write_text("not a jpeg")
    tars = folders_to_tars(rgb_tree, tmp_path / "tars")
    (tars / "notes.txt").write_text("stray")
    (tars / "n00000009.tar").write_bytes(b"garbage, not a tar")
    out = prepare(make_config(tars, layout="tars"), progress=False)
    reasons = {item["path"]: item["reason"] for item in read_manifest(out)["skipped"]}
    assert "not an image" in reasons["n00000001.tar/n00000001_9.JPEG"]
    assert "cannot read tar" in reasons["n00000009.tar"]
    assert "notes.txt" in reasons
    assert len(shard_contents(out)) == 9
    with pytest.raises(SourceError, match="n00000009.tar: cannot read tar"):
        prepare(make_config(tars, "dataset.shards.strict=true", layout="tars"), progress=False)


def test_strict_mode_stops_naming_the_file(rgb_tree, make_config, tmp_path, capsys):
    bad = rgb_tree / "n00000001" / "n00000001_zero.JPEG"
    bad.write_bytes(b"")
    with pytest.raises(SourceError, match=str(bad)):
        prepare(make_config(rgb_tree, "dataset.shards.strict=true"), progress=False)
    argv = [
        "prepare-shards",
        "--no-progress",
        "dataset=imagenet1k",
        f"dataset.source={rgb_tree}",
        "dataset.num_classes=5",
        "dataset.shards.strict=true",
        f"paths.results={tmp_path / 'cli'}",
    ]
    assert cli.main(argv) == 3
    assert f"ralp-pipe prepare-shards: data error: unusable source file {bad}" in capsys.readouterr().err


def test_vanished_source_fails_naming_it(rgb_tree, make_config):
    cfg = make_config(rgb_tree)
    for path in sorted(rgb_tree.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    rgb_tree.rmdir()
    with pytest.raises(SourceError, match=str(rgb_tree)):
        prepare(cfg, progress=False)


def test_too_many_classes_for_num_classes_is_refused(rgb_tree, make_config):
    with pytest.raises(SourceError, match="num_classes=2"):
        prepare(make_config(rgb_tree, "dataset.num_classes=2"), progress=False)


@pytest.mark.slow  # two runs with a pool of 2 spawned workers (2.5 s alone, 7 s in the suite)
def test_rerun_on_unchanged_input_touches_nothing(rgb_tree, make_config):
    cfg = make_config(rgb_tree, "dataset.shards.images_per_shard=2", "dataset.shards.workers=2")
    out = prepare(cfg, progress=False)
    before, manifest = mtimes(out), (out / "manifest.json").read_bytes()
    prepare(cfg, progress=False)
    assert mtimes(out) == before
    assert (out / "manifest.json").read_bytes() == manifest


def test_interrupted_run_resumes_without_redoing_finished_shards(rgb_tree, make_config):
    cfg = make_config(rgb_tree, "dataset.shards.images_per_shard=2")
    out = prepare(cfg, progress=False)
    manifest = (out / "manifest.json").read_bytes()
    lost, damaged = out / "shard-000001.tar", out / "shard-000003.tar"
    lost_bytes, damaged_bytes = lost.read_bytes(), damaged.read_bytes()
    # What an interruption leaves: a shard never renamed into place, a half-written temporary,
    # a record from an older run; plus a shard damaged afterwards.
    lost.unlink()
    (out / ".shard-000001.tar.x1y2.tmp").write_bytes(lost_bytes[:100])
    damaged.write_bytes(damaged_bytes[:-512])
    (out / "parts" / "shard-000099.json").write_text("{}")
    redone = ("shard-000001", "shard-000003", "shard-000099", ".")
    untouched = {k: v for k, v in mtimes(out).items() if not k.rpartition("/")[2].startswith(redone)}
    prepare(cfg, progress=False)
    after = mtimes(out)
    assert {k: after[k] for k in untouched} == untouched
    assert lost.read_bytes() == lost_bytes and damaged.read_bytes() == damaged_bytes
    assert not list(out.glob(".*.tmp")) and not (out / "parts" / "shard-000099.json").exists()
    assert (out / "manifest.json").read_bytes() == manifest


def test_changed_options_rebuild_and_drop_stale_shards(rgb_tree, make_config):
    out = prepare(make_config(rgb_tree, "dataset.shards.images_per_shard=2"), progress=False)
    assert len(read_manifest(out)["shards"]) == 5
    prepare(make_config(rgb_tree, "dataset.shards.images_per_shard=4"), progress=False)
    assert sorted(p.name for p in out.glob("shard-*")) == [
        f"shard-00000{i}.{e}" for i in range(3) for e in ("idx", "tar")
    ]
    assert len(shard_contents(out)) == 9


@pytest.mark.slow  # a prepare-shards subprocess, killed and rerun (~3 s)
def test_killed_run_resumes_and_ends_like_a_clean_run(tmp_path, make_config):
    root = tmp_path / "big"
    for label in range(3):
        (root / f"n{label:08d}").mkdir(parents=True)
        for number in range(20):  # PNGs under .JPEG names: each one is re-encoded, so the run takes a while
            image = noise_image(label * 100 + number, size=(384, 384))
            (root / f"n{label:08d}" / f"n{label:08d}_{number}.JPEG").write_bytes(encode(image, "PNG"))
    argv = [
        sys.executable,
        "-m",
        "ralp_pipe.cli",
        "prepare-shards",
        "--no-progress",
        "dataset=imagenet1k",
        f"dataset.source={root}",
        "dataset.num_classes=5",
        "dataset.shards.images_per_shard=1",
        "dataset.shards.workers=1",
        "dataset.shards.resize_shorter=null",
        f"paths.results={tmp_path / 'results'}",
    ]
    out = tmp_path / "results" / "data" / "imagenet1k"
    run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Freeze the run (SIGSTOP) as soon as 3 records exist, so that it cannot go on to finish every
    # shard and the manifest between this check and the kill; then kill it where it stands.
    deadline = time.monotonic() + 60
    try:
        while len(list(out.glob("parts/shard-*.json"))) < 3:
            if run.poll() is not None:
                pytest.fail(f"prepare-shards exited with status {run.returncode} before 3 shards were finished")
            if time.monotonic() > deadline:
                pytest.fail("prepare-shards finished fewer than 3 shards in 60 s")
            time.sleep(0.01)
        run.send_signal(signal.SIGSTOP)
        assert run.poll() is None, f"prepare-shards ended (status {run.returncode}) before it could be killed"
    finally:
        run.kill()
        run.wait()
    # A shard is finished once its record is written (after its tar and index are in place).
    finished = {f"{p.stem}.tar": (out / f"{p.stem}.tar").stat().st_mtime_ns for p in out.glob("parts/shard-*.json")}
    assert 3 <= len(finished) < 60 and not (out / "manifest.json").exists()
    prepare(make_config(root, "dataset.shards.images_per_shard=1"), progress=False)
    assert {name: (out / name).stat().st_mtime_ns for name in finished} == finished
    clean = prepare(
        make_config(root, "dataset.shards.images_per_shard=1", f"paths.results={tmp_path / 'clean'}"), progress=False
    )
    assert (out / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()


def test_a_failed_pool_leaves_only_finished_shards(tmp_path: Path) -> None:
    """Workers killed mid-write (another shard's full disk) leave temporaries and shards without their record:
    the failure path removes both and keeps every shard that has its record."""
    (tmp_path / "parts").mkdir()
    for name in ("shard-000000.tar", "shard-000000.idx", "parts/shard-000000.json"):  # finished
        (tmp_path / name).write_bytes(b"x")
    for name in ("shard-000001.tar", "shard-000001.idx", ".shard-000002.tar.abc123.tmp", "parts/.x.json.q.tmp"):
        (tmp_path / name).write_bytes(b"x")
    plan = [PlannedShard(f"shard-00000{i}", (), "") for i in range(3)]
    _remove_unfinished(tmp_path, plan)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["parts/shard-000000.json", "shard-000000.idx", "shard-000000.tar"]
