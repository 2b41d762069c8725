"""Images/sec of the DALI CPU pipeline vs the torchvision loader on the same shards (target: ratio >= 1).

Both loaders read the prepared shards of the configured dataset with the same batch size, crop
size (`train.image_size`) and thread count (`train.loader_threads`), on the CPU. They are built
once and measured in alternating windows: each window first drains `--drain` batches (emptying
what the loader prefetched while the other one ran) and then times `--batches` batches. The
median over `--repeats` windows is reported per loader, with the ratio DALI / torchvision.

Run: `python benchmarks/loaders.py [--batch-size 32 --batches 20 --repeats 3] dataset=synthetic1k train.image_size=64`
(shards are prepared first if the dataset has none).
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice
from typing import Iterable

import torch

from ralp_pipe.config import load
from ralp_pipe.data.loaders import make_loader
from ralp_pipe.data.shards import MANIFEST, output_dir, prepare, read_manifest

KINDS = ("dali", "torchvision")


def window(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], drain: int, count: int) -> float:
    """Images/sec over `count` batches after draining `drain` batches."""
    for _ in islice(batches, drain):
        pass
    start, images = time.perf_counter(), 0
    for batch, _ in islice(batches, count):
        images += batch.shape[0]
    return images / (time.perf_counter() - start)


def main() -> int:
    """Prepare shards if needed, measure both loaders alternately and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per window")
    parser.add_argument("--drain", type=int, default=6, help="untimed batches before each window")
    parser.add_argument("--repeats", type=int, default=3, help="windows per loader")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=synthetic1k train.image_size=64")
    args = parser.parse_intermixed_args()
    cfg = load(args.overrides)
    shards_dir = output_dir(cfg)
    if not (shards_dir / MANIFEST).is_file():
        prepare(cfg)
    manifest = read_manifest(shards_dir)
    size, threads = cfg.train.image_size, cfg.train.loader_threads
    print(
        f"shards: {shards_dir} ({len(manifest['shards'])} shards, {manifest['images']} images, "
        f"{manifest['shards'][0]['name']} .. {manifest['shards'][-1]['name']})"
    )
    print(f"batch {args.batch_size}, crop {size}, threads {threads}, cpu, {args.repeats} x {args.batches} batches each")
    loaders = {
        kind: iter(
            make_loader(
                kind, shards_dir, args.batch_size, size, cfg.dataset.num_classes, threads=threads, seed=cfg.train.seed
            )
        )
        for kind in KINDS
    }
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for repeat in range(args.repeats):
        for kind in KINDS if repeat % 2 == 0 else reversed(KINDS):
            rates[kind].append(window(loaders[kind], args.drain, args.batches))
            print(f"  window {repeat + 1} {kind:>12}: {rates[kind][-1]:8.1f} img/s")
    median = {kind: statistics.median(values) for kind, values in rates.items()}
    ratio = median["dali"] / median["torchvision"]
    print(
        f"dali {median['dali']:.1f} img/s | torchvision {median['torchvision']:.1f} img/s | "
        f"ratio dali/torchvision {ratio:.2f} ({'meets' if ratio >= 1 else 'misses'} target >= 1)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
