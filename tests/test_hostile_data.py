"""prepare-shards on hostile input: concurrent runs, cut tars, empty sources, unusual pixel modes, unsafe names."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import encode, folders_to_tars, noise_image
from ralp_pipe import cli
from ralp_pipe.config import SyntheticSource
from ralp_pipe.data import synthetic
from ralp_pipe.data.imaging import to_rgb_jpeg
from ralp_pipe.data.shards import LOCK, output_dir, prepare, read_manifest
from ralp_pipe.errors import DataError

# Holds flock on the lock file with its PID in it, says so on stdout, then sleeps argv[2] seconds.
HOLDER = """
import fcntl, os, sys, time
with open(sys.argv[1], "a+") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    handle.truncate(0); handle.write(f"{os.getpid()}\\n"); handle.flush()
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold_lock(out: Path, seconds: float) -> subprocess.Popen[str]:
    """A child process holding the prepare lock of `out` for `seconds`."""
    out.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out / LOCK), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def synthetic_config(make_config, *overrides: str):
    return make_config(
        None,
        "dataset=synthetic1k",
        "dataset.num_classes=3",
        "dataset.synthetic.images_per_class=2",
        "dataset.synthetic.height=16",
        "dataset.synthetic.width=16",
        *overrides,
    )


@pytest.mark.slow
def test_second_prepare_on_the_same_output_refuses_naming_the_holder(make_config):
    cfg = synthetic_config(make_config)
    holder = hold_lock(output_dir(cfg), 60)
    try:
        with pytest.raises(DataError, match=f"PID {holder.pid}"):
            prepare(cfg, progress=False, lock_wait_s=0.5)
        assert not (output_dir(cfg) / "source").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_second_prepare_waits_for_the_first_then_runs(make_config, capsys):
    cfg = synthetic_config(make_config)
    holder = hold_lock(output_dir(cfg), 1.0)
    try:
        started = time.monotonic()
        out = prepare(cfg, progress=False, lock_wait_s=60)
        assert time.monotonic() - started > 0.5 and holder.poll() is not None
    finally:
        holder.kill()
        holder.wait()
    assert f"being prepared by PID {holder.pid}; waiting" in capsys.readouterr().err
    assert read_manifest(out)["images"] == 6
    assert (out / LOCK).read_text() == ""


def test_synthetic_collection_changed_while_built_is_not_stamped_complete(tmp_path, monkeypatch):
    original = synthetic._write_classes

    def write_then_lose_one(folder: Path, start: int, stop: int, options: SyntheticSource) -> None:
        original(folder, start, stop, options)
        (folder / "n00000001" / "n00000001_0.JPEG").unlink()  # what a concurrent rebuild's cleanup does

    monkeypatch.setattr(synthetic, "_write_classes", write_then_lose_one)
    target = tmp_path / "source"
    with pytest.raises(DataError, match="incomplete: 5 images in 3 classes, expected 6 in 3"):
        synthetic.generate(target, 3, SyntheticSource(2, 16, 16, 0))
    assert not target.exists() and not target.with_name("source.json").exists()


def cut_tars(rgb_tree: Path, tmp_path: Path, cut: str) -> Path:
    """Per-synset tars of `rgb_tree` with n00000002.tar cut after its first member, `cut` says where."""
    tars = folders_to_tars(rgb_tree, tmp_path / "tars")
    path = tars / "n00000002.tar"
    with tarfile.open(path) as archive:
        second = archive.getmembers()[1].offset  # header of the second member, on a 512-byte boundary
    data = path.read_bytes()
    path.write_bytes(data[: second if cut == "at a block boundary" else second + 100])
    return tars


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["at a block boundary", "inside a header"])
def test_cut_synset_tar_is_reported_damaged_and_stops_strict_mode(rgb_tree, make_config, tmp_path, cut):
    tars = cut_tars(rgb_tree, tmp_path, cut)
    out = prepare(make_config(tars, layout="tars"), progress=False)
    manifest = read_manifest(out)
    reasons = {item["path"]: item["reason"] for item in manifest["skipped"]}
    assert set(reasons) == {"n00000002.tar"}
    assert "truncated" in reasons["n00000002.tar"] and str(tars / "n00000002.tar") in reasons["n00000002.tar"]
    assert manifest["counts_per_class"] == {"n00000000": 2, "n00000001": 3, "n00000002": 1}
    with pytest.raises(DataError, match="n00000002.tar: truncated tar"):
        prepare(make_config(tars, "dataset.shards.strict=true", layout="tars"), progress=False)


@pytest.mark.slow
def test_unsafe_member_path_in_a_synset_tar_is_named_so(rgb_tree, make_config, tmp_path):
    tars = folders_to_tars(rgb_tree, tmp_path / "tars")
    with tarfile.open(tars / "n00000000.tar", "a") as archive:
        data = encode(noise_image(5))
        info = tarfile.TarInfo("../../x.JPEG")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    reasons = {
        i["path"]: i["reason"]
        for i in read_manifest(prepare(make_config(tars, layout="tars"), progress=False))["skipped"]
    }
    assert reasons == {"n00000000.tar/../../x.JPEG": "unsafe path (absolute or with a '..' part)"}


@pytest.mark.slow
def test_source_without_usable_images_fails_saying_what_was_found(tmp_path, make_config, capsys):
    root = tmp_path / "empty"
    (root / "n01440764").mkdir(parents=True)
    (root / "n01440764" / "a.JPEG").write_text("<html>404</html>")
    (root / "n01440764" / "b.JPEG").write_text("not an image either")
    good = encode(noise_image(1))
    (root / "n01440764" / "c.JPEG").write_bytes(good[: len(good) // 2])
    with pytest.raises(
        DataError,
        match=rf"0 usable images in {root}: 3 entries skipped \(2 not an image, "
        rf"1 cannot decode\); expected {root}/n01440764/\*\.JPEG",
    ):
        prepare(make_config(root), progress=False)
    assert not (tmp_path / "results" / "data" / "imagenet1k" / "manifest.json").exists()
    argv = [
        "prepare-shards",
        "--no-progress",
        "dataset=imagenet1k",
        "dataset.layout=tars",
        f"dataset.source={root}",
        "dataset.num_classes=5",
        f"paths.results={tmp_path / 'cli'}",
    ]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ralp-pipe prepare-shards: data error: 0 usable images in {root}: 1 entries skipped "
        f"(1 not a <synset>.tar file); expected {root}/n01440764.tar (dataset.layout=tars)"
    ]


@pytest.mark.slow
def test_emptied_source_drops_the_old_manifest(rgb_tree, make_config):
    out = prepare(make_config(rgb_tree), progress=False)
    for image in rgb_tree.rglob("*.JPEG"):
        image.write_text("gone")
    with pytest.raises(DataError, match="0 usable images"):
        prepare(make_config(rgb_tree), progress=False)
    assert not (out / "manifest.json").exists() and not list(out.glob("shard-*"))


def pixels_of(data: bytes) -> np.ndarray:
    """The RGB pixels of stored JPEG bytes."""
    with Image.open(io.BytesIO(data)) as image:
        assert image.mode == "RGB"
        return np.asarray(image).astype(int)


def halves(mode: str, left: float, right: float) -> Image.Image:
    """A 16x16 image of `mode`, `left` in its left 8 columns and `right` in the others (aligned to JPEG blocks)."""
    values = np.array([[left] * 8 + [right] * 8] * 16)
    dtype = {"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode]
    return Image.fromarray(values.astype(dtype), mode)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (Image.new("I;16", (16, 16), 30000), (117, 117)),  # 30000 * 255 / 65535
        (Image.new("I;16B", (16, 16), 30000), (117, 117)),
        (Image.new("I", (16, 16), 30000), (117, 117)),  # max <= 65535: read as 16-bit
        (halves("I", -50000, 150000), (0, 255)),  # beyond 16 bits: the image's range
        (halves("F", 0.25, 1.0), (64, 255)),  # within [0, 1]
        (halves("F", -1.0, 3.0), (0, 255)),  # beyond: the image's range
        (Image.new("LA", (16, 16), (0, 0)), (255, 255)),  # transparent black on white
        (Image.new("LA", (16, 16), (0, 255)), (0, 0)),  # opaque black
        (Image.new("RGBA", (16, 16), (0, 0, 0, 102)), (153, 153)),  # 60% transparent black on white
        (Image.new("PA", (16, 16), (0, 0)), (255, 255)),
    ],
    ids=["I;16", "I;16B", "I-16bit", "I-range", "F-unit", "F-range", "LA-clear", "LA-opaque", "RGBA-40%", "PA"],
)
def test_high_bit_depth_and_alpha_images_map_to_the_right_8_bit_value(image: Image.Image, expected: tuple[int, int]):
    fmt = "TIFF" if image.mode in ("I;16B", "I", "F", "PA") else "PNG"  # the format that keeps the mode
    data, reencoded = to_rgb_jpeg(encode(image, fmt), None)
    pixels = pixels_of(data)
    assert reencoded and abs(pixels[8, 3] - expected[0]).max() <= 2 and abs(pixels[8, 12] - expected[1]).max() <= 2


def test_palette_with_a_transparent_colour_is_composited_on_white():
    image = Image.new("P", (16, 16), 0)
    image.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    image.paste(1, (8, 0, 16, 16))
    out = io.BytesIO()
    image.save(out, "PNG", transparency=0)
    pixels = pixels_of(to_rgb_jpeg(out.getvalue(), None)[0])
    assert abs(pixels[8, 3] - 255).max() <= 2 and abs(pixels[8, 12] - [200, 10, 10]).max() <= 4
