"""Loaders: DALI accepts the index files, DALI and torchvision agree, ranks split, synthetic batches."""

from __future__ import annotations

import itertools
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ralp_pipe.config import ConfigError
from ralp_pipe.data.loaders import make_loader, rank_range
from ralp_pipe.data.shards import prepare, read_manifest
from ralp_pipe.data.tarshard import read_index

BATCH = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 synthetic images of 6 classes in 3 shards of 8."""
    from ralp_pipe.config import load

    results = tmp_path_factory.mktemp("results")
    cfg = load(
        [
            f"paths.results={results}",
            "dataset.num_classes=6",
            "dataset.synthetic.images_per_class=4",
            "dataset.synthetic.height=40",
            "dataset.synthetic.width=48",
            "dataset.shards.images_per_shard=8",
            "dataset.shards.workers=1",
        ]
    )
    return prepare(cfg, progress=False)


def labels_in_order(shards: Path) -> list[int]:
    """Labels of all samples, shards in manifest order, samples in tar order."""
    labels = []
    for shard in read_manifest(shards)["shards"]:
        with tarfile.open(shards / shard["name"]) as archive:
            labels += [int(archive.extractfile(m).read()) for m in archive if m.name.endswith(".cls")]  # type: ignore[union-attr]
    return labels


def take_labels(loader, batches: int, image_size: int = 32) -> list[int]:
    labels = []
    for images, batch_labels in itertools.islice(iter(loader), batches):
        assert images.shape == (BATCH, 3, image_size, image_size) and images.dtype == torch.float32
        assert batch_labels.shape == (BATCH,) and batch_labels.dtype == torch.int64
        labels += batch_labels.tolist()
    return labels


@pytest.mark.slow
def test_dali_reads_every_member_through_our_index_files(shards):
    from nvidia.dali import fn, pipeline_def

    entries = read_manifest(shards)["shards"]
    expected = []
    for shard in entries:
        with tarfile.open(shards / shard["name"]) as archive:
            files = {m.name: archive.extractfile(m).read() for m in archive}  # type: ignore[union-attr]
        expected += [(files[s["jpg"].name], files[s["cls"].name]) for s in read_index(shards / shard["index"])]

    @pipeline_def(batch_size=6, num_threads=1, device_id=None)
    def reader():
        jpegs, classes = fn.readers.webdataset(
            paths=[str(shards / s["name"]) for s in entries],
            index_paths=[str(shards / s["index"]) for s in entries],
            ext=["jpg", "cls"],
            missing_component_behavior="error",
        )
        return jpegs, classes

    pipe = reader()
    pipe.build()
    got = []
    for _ in range(4):
        jpegs, classes = pipe.run()
        got += [(np.array(jpegs[i]).tobytes(), np.array(classes[i]).tobytes()) for i in range(6)]
    assert got == expected


@pytest.mark.slow
def test_dali_refuses_a_damaged_index(shards, tmp_path):
    from nvidia.dali import fn, pipeline_def

    entry = read_manifest(shards)["shards"][0]
    broken = tmp_path / "broken.idx"
    broken.write_text((shards / entry["index"]).read_text().replace(" 512 ", " 500 ", 1))

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def reader():
        return fn.readers.webdataset(paths=[str(shards / entry["name"])], index_paths=[str(broken)], ext=["jpg"])

    with pytest.raises(RuntimeError, match="multiple of tar block size"):
        reader().build()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_dali_and_torchvision_agree_on_labels_and_shapes(shards, world_size):
    everything = labels_in_order(shards)
    for rank in range(world_size):
        part = [everything[i] for i in rank_range(len(everything), rank, world_size)]
        epoch = len(part) // BATCH
        for kind in ("dali", "torchvision"):
            loader = make_loader(kind, shards, BATCH, 32, 6, rank=rank, world_size=world_size, threads=2, shuffle=False)
            assert take_labels(loader, 2 * epoch) == part * 2, kind


def test_shuffled_torchvision_epoch_is_a_permutation_of_the_rank_part(shards):
    loader = make_loader("torchvision", shards, BATCH, 32, 6, threads=1, seed=3)
    labels = take_labels(loader, 6)
    assert sorted(labels) == sorted(labels_in_order(shards)) and labels != labels_in_order(shards)


# Two uniform colours (RGB 0-255), one per class, and each one's channel means after the loader,
# worked out by hand as (value / 255 - mean) / std with the ImageNet mean (0.485, 0.456, 0.406) and
# std (0.229, 0.224, 0.225): e.g. red 200 -> (0.7843 - 0.485) / 0.229 = 1.3070. Unnormalised [0, 1]
# data would give 0.784, 0.392, 0.196; BGR order or a missing std other values again.
COLOURS = {0: (200, 100, 50), 1: (30, 160, 220)}
NORMALISED = {0: (1.3070, -0.2850, -0.9330), 1: (-1.6042, 0.7654, 2.0300)}
# These uniform JPEGs decode to their exact colour (measured: within 0.0004 of the values above,
# their rounding); a decoder rounding YCbCr to RGB otherwise is off by one level, 1 / 255 / 0.224 =
# 0.0175 after normalisation. Crops, resizes and flips of a uniform image keep it uniform.
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def uniform_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards prepared from 64x48 JPEGs of one uniform colour per class, 4 images each."""
    from PIL import Image

    from ralp_pipe.config import load

    root = tmp_path_factory.mktemp("uniform")
    for label, colour in COLOURS.items():
        folder = root / "source" / f"n{label:08d}"
        folder.mkdir(parents=True)
        for number in range(4):
            Image.new("RGB", (64, 48), colour).save(folder / f"n{label:08d}_{number}.JPEG", quality=95)
    cfg = load(
        [
            "dataset=imagenet1k",
            f"dataset.source={root / 'source'}",
            f"paths.results={root / 'results'}",
            "dataset.num_classes=2",
            "dataset.shards.images_per_shard=4",
            "dataset.shards.workers=1",
        ]
    )
    return prepare(cfg, progress=False)


@pytest.mark.parametrize("kind", ["dali", "torchvision"])
def test_loaders_normalise_each_channel_and_crop_to_the_image_size(uniform_shards: Path, kind: str) -> None:
    threads = 1 if kind == "dali" else 0  # torchvision in this process: no worker to start
    images, labels = next(iter(make_loader(kind, uniform_shards, BATCH, 24, 2, threads=threads)))
    assert images.shape == (BATCH, 3, 24, 24) and images.dtype == torch.float32  # 64x48 sources, square crops
    for image, label in zip(images, labels.tolist()):
        means, stds = image.mean(dim=(1, 2)).tolist(), image.std(dim=(1, 2)).tolist()
        assert means == pytest.approx(NORMALISED[label], abs=TOLERANCE), (kind, label, means)
        assert max(stds) < TOLERANCE, (kind, label, stds)  # a uniform image stays uniform


def test_synthetic_batches_are_deterministic_and_split_invariant():
    first = [b for b in itertools.islice(iter(make_loader("synthetic", None, 8, 32, 10, seed=5)), 3)]
    again = [b for b in itertools.islice(iter(make_loader("synthetic", None, 8, 32, 10, seed=5)), 3)]
    halves = [
        itertools.islice(iter(make_loader("synthetic", None, 4, 32, 10, rank=r, world_size=2, seed=5)), 3)
        for r in range(2)
    ]
    for (images, labels), (images2, labels2), (a, b) in zip(first, again, zip(*halves)):
        assert images.shape == (8, 3, 32, 32) and labels.dtype == torch.int64
        assert torch.equal(images, images2) and torch.equal(labels, labels2)
        assert torch.equal(images, torch.cat([a[0], b[0]])) and torch.equal(labels, torch.cat([a[1], b[1]]))
        assert 0 <= labels.min() and labels.max() < 10
    assert not torch.equal(first[0][0], first[1][0])
    other_seed = next(iter(make_loader("synthetic", None, 8, 32, 10, seed=6)))
    assert not torch.equal(first[0][0], other_seed[0])


def test_bad_loader_requests_are_refused(shards):
    with pytest.raises(ConfigError, match="prepare-shards"):
        make_loader("dali", None, BATCH, 32, 6)
    with pytest.raises(ConfigError, match="6 classes"):
        make_loader("torchvision", shards, BATCH, 32, 3)
    with pytest.raises(ConfigError, match="rank 2"):
        make_loader("synthetic", None, BATCH, 32, 6, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="kind 'tf'"):
        make_loader("tf", shards, BATCH, 32, 6)
