"""Deterministic synthetic ImageNet twin: real JPEG files in the class-folder layout."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.config import SyntheticSource
from ralp_pipe.errors import DataError
from ralp_pipe.runtime.process import process_pool

GENERATOR_VERSION = 1
JPEG_QUALITY = 90


def synset_ids(num_classes: int) -> list[str]:
    """Synset-like class ids `n00000000`, `n00000001`, ... in label order."""
    return [_synset(index) for index in range(num_classes)]


def class_images(synset_index: int, options: SyntheticSource) -> list[bytes]:
    """The JPEG bytes of one class: a class colour plus per-image noise, fixed by the seed."""
    rng = np.random.default_rng([options.seed, synset_index])
    colour = rng.integers(40, 216, size=3)
    images = []
    for _ in range(options.images_per_class):
        noise = rng.integers(-40, 41, size=(options.height, options.width, 3))
        pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=JPEG_QUALITY)
        images.append(out.getvalue())
    return images


def generate(target: Path, num_classes: int, options: SyntheticSource, workers: int = 1) -> Path:
    """Write the collection to `target` (class folders of `<synset>_<i>.JPEG`) unless it is already there.

    A `target.json` stamp beside the folder records the settings of a finished collection; with
    the same settings nothing is rewritten, otherwise the folder is rebuilt under a temporary name,
    counted against the settings and swapped in. The caller holds the lock of the folder above
    `target` (`ralp_pipe.data.shards.output_lock`): the temporary folder of an earlier, killed
    build is deleted.
    """
    stamp = target.with_name(target.name + ".json")
    settings = {"generator": GENERATOR_VERSION, "num_classes": num_classes, **vars(options)}
    if target.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == settings:
        return target
    building = target.with_name(f".{target.name}.building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    bounds = [num_classes * part // workers for part in range(workers + 1)]
    try:
        if workers == 1:
            _write_classes(building, 0, num_classes, options)
        else:
            with process_pool(workers) as pool:
                for done in [pool.submit(_write_classes, building, a, b, options) for a, b in zip(bounds, bounds[1:])]:
                    done.result()
        _check_complete(building, num_classes, options.images_per_class)
    except BaseException:  # a full disk, an interrupt: no half-built collection is left taking the space
        shutil.rmtree(building, ignore_errors=True)
        raise
    stamp.unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(building, target)
    write_json_atomic(stamp, settings)
    return target


def _check_complete(folder: Path, num_classes: int, images_per_class: int) -> None:
    """Refuse a generated collection whose classes or images differ from what was asked."""
    expected = {synset: images_per_class for synset in synset_ids(num_classes)}
    found = {entry.name: len(os.listdir(entry)) for entry in folder.iterdir() if entry.is_dir()}
    if found != expected:
        wrong = sorted(set(found) ^ set(expected)) + sorted(
            s for s in found.keys() & expected if found[s] != expected[s]
        )
        raise DataError(
            f"synthetic collection in {folder} is incomplete: {sum(found.values())} images in {len(found)} classes, "
            f"expected {num_classes * images_per_class} in {num_classes} (first difference: {wrong[0]}); "
            f"was it changed by another process? run prepare-shards again"
        )


def _write_classes(folder: Path, start: int, stop: int, options: SyntheticSource) -> None:
    """Write the class folders with labels in [start, stop) under `folder`."""
    for index in range(start, stop):
        synset = _synset(index)
        (folder / synset).mkdir()
        for number, data in enumerate(class_images(index, options)):
            (folder / synset / f"{synset}_{number}.JPEG").write_bytes(data)


def _synset(index: int) -> str:
    return f"n{index:08d}"
