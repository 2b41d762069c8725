"""Training input: `make_loader(kind, ...)` yields (images float32 NCHW normalised, labels int64) forever.

Kinds: `dali` (DALI pipeline over the webdataset shards; CPU decoding, or "mixed" GPU decoding
on CUDA), `torchvision` (PIL decoding + torchvision transforms in DataLoader workers over the
same shards) and `synthetic` (in-memory random batches, no files). Both file loaders split the
samples of all shards the same way DALI does: rank r of w reads samples [N*r//w, N*(r+1)//w)
of the shards in manifest order, every epoch.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from ralp_pipe.config import LOADERS, ConfigError
from ralp_pipe.data.shards import read_manifest
from ralp_pipe.data.tarshard import Member, read_index

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SYNTHETIC_STEPS = 2  # distinct synthetic batches cycled (tf_cnn_benchmarks reuses one)
SHUFFLE_BUFFER = 1024


def make_loader(
    kind: str,
    shards_dir: Path | None,
    batch_size: int,
    image_size: int,
    num_classes: int,
    rank: int = 0,
    world_size: int = 1,
    threads: int = 2,
    seed: int = 0,
    device: str = "cpu",
    shuffle: bool = True,
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """An endless iterable of (images [N,3,S,S] float32 normalised, labels [N] int64) for this rank."""
    if kind not in LOADERS:
        raise ConfigError(f"loader kind {kind!r} is not known; choose one of: {', '.join(LOADERS)}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    if not reads_shards(kind):
        return _synthetic(batch_size, image_size, num_classes, rank, seed, torch.device(device))
    if shards_dir is None:
        raise ConfigError(f"the {kind} loader reads shards: pass the folder made by `ralp-pipe prepare-shards`")
    shards = shard_files(Path(shards_dir), num_classes)
    if kind == "dali":
        return _dali(shards, batch_size, image_size, rank, world_size, threads, seed, device, shuffle)
    return _torchvision(shards, batch_size, image_size, rank, world_size, threads, seed, device, shuffle)


def reads_shards(kind: str) -> bool:
    """Whether loader `kind` reads prepared shards (all but `synthetic`, which makes batches in memory)."""
    return kind != "synthetic"


def rank_range(total: int, rank: int, world_size: int) -> range:
    """The sample indices rank `rank` of `world_size` reads (DALI's shard_id/num_shards split)."""
    return range(total * rank // world_size, total * (rank + 1) // world_size)


def shard_files(shards_dir: Path, num_classes: int) -> list[tuple[Path, Path]]:
    """(tar, index) paths of the prepared shards, checking their labels fit `num_classes`; ConfigError naming
    the folder where they are missing or do not fit."""
    manifest = read_manifest(shards_dir)
    if manifest["classes_found"] > num_classes:
        raise ConfigError(
            f"shards in {shards_dir} hold {manifest['classes_found']} classes but the model has {num_classes} outputs"
        )
    if not manifest["shards"]:
        raise ConfigError(f"{shards_dir}/manifest.json lists no shards (no usable images were found)")
    return [(shards_dir / s["name"], shards_dir / s["index"]) for s in manifest["shards"]]


def _synthetic(
    batch_size: int, image_size: int, num_classes: int, rank: int, seed: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Cycle SYNTHETIC_STEPS random batches; sample j of step s is fixed by (seed, s, rank*batch_size+j).

    Keying samples by their place in the global batch makes the global batch independent of how
    it is split: 2 ranks of 16 see the same images as 4 ranks of 8.
    """
    steps = []
    for step in range(SYNTHETIC_STEPS):
        images, labels = [], []
        for slot in range(rank * batch_size, (rank + 1) * batch_size):
            gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_003 + slot) % 2**63)
            images.append(torch.randn(3, image_size, image_size, generator=gen))
            labels.append(torch.randint(num_classes, (), generator=gen))
        steps.append((torch.stack(images).to(device), torch.stack(labels).to(device)))
    while True:
        yield from steps


def _dali(
    shards: list[tuple[Path, Path]],
    batch_size: int,
    image_size: int,
    rank: int,
    world_size: int,
    threads: int,
    seed: int,
    device: str,
    shuffle: bool,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from a DALI webdataset pipeline (decode, random resized crop, flip, normalise, CHW)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    on_gpu = torch.device(device).type == "cuda"

    @pipeline_def
    def pipeline() -> tuple[Any, Any]:
        jpegs, labels = fn.readers.webdataset(  # type: ignore[misc]  # DALI types its nodes loosely
            paths=[str(tar) for tar, _ in shards],
            index_paths=[str(idx) for _, idx in shards],
            ext=["jpg", "cls"],
            missing_component_behavior="error",
            shard_id=rank,
            num_shards=world_size,
            random_shuffle=shuffle,
            initial_fill=SHUFFLE_BUFFER,
            stick_to_shard=True,
            name="reader",
        )
        images = fn.decoders.image_random_crop(jpegs, device="mixed" if on_gpu else "cpu", output_type=types.RGB)  # type: ignore[attr-defined]
        images = fn.resize(images, resize_x=image_size, resize_y=image_size)  # type: ignore[assignment]
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,  # type: ignore[attr-defined]
            output_layout="CHW",
            mirror=fn.random.coin_flip(),
            mean=[255 * m for m in MEAN],
            std=[255 * s for s in STD],
        )
        return images, labels

    index = torch.device(device).index
    device_id = (torch.cuda.current_device() if index is None else index) if on_gpu else None
    pipe = pipeline(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=seed * 1000 + rank)
    pipe.build()
    for batch in DALIGenericIterator([pipe], ["images", "labels"]):
        yield batch[0]["images"], _decode_labels(batch[0]["labels"]).to(batch[0]["images"].device)


def _decode_labels(digits: torch.Tensor) -> torch.Tensor:
    """int64 labels from the fixed-width ASCII `.cls` bytes of a batch ([N, digits] uint8)."""
    powers = 10 ** torch.arange(digits.shape[1] - 1, -1, -1, dtype=torch.int64)
    return ((digits.cpu().to(torch.int64) - ord("0")) * powers).sum(dim=1)


class ShardSamples(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Samples of webdataset shards read through their index files, transformed with torchvision."""

    def __init__(self, shards: list[tuple[Path, Path]], image_size: int) -> None:
        from torchvision import transforms

        self.members: list[tuple[str, Member, Member]] = [
            (str(tar), sample["jpg"], sample["cls"]) for tar, idx in shards for sample in read_index(idx)
        ]
        self.transform = transforms.Compose(
            [
                transforms.RandomResizedCrop(image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(MEAN, STD),
            ]
        )
        self._files: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        tar, jpg, cls = self.members[index]
        handle = self._files.get(tar) or self._files.setdefault(tar, open(tar, "rb"))
        handle.seek(jpg.offset)
        data = handle.read(jpg.size)
        handle.seek(cls.offset)
        label = int(handle.read(cls.size))
        with Image.open(io.BytesIO(data)) as image:
            return self.transform(image.convert("RGB")), label


class EndlessSampler(torch.utils.data.Sampler[int]):
    """The indices of one rank's part, epoch after epoch (reshuffled per epoch when `shuffle`)."""

    def __init__(self, part: range, shuffle: bool, seed: int) -> None:
        self.part, self.shuffle, self.seed = part, shuffle, seed

    def __iter__(self) -> Iterator[int]:
        order, epoch = list(self.part), 0
        while True:
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            yield from order
            epoch += 1


def _torchvision(
    shards: list[tuple[Path, Path]],
    batch_size: int,
    image_size: int,
    rank: int,
    world_size: int,
    threads: int,
    seed: int,
    device: str,
    shuffle: bool,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from a torch DataLoader with `threads` worker processes over this rank's samples."""
    dataset = ShardSamples(shards, image_size)
    part = rank_range(len(dataset), rank, world_size)
    if not part:
        raise ConfigError(f"rank {rank} of {world_size} gets no samples: the shards hold only {len(dataset)}")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EndlessSampler(part, shuffle, seed * 1000 + rank),
        num_workers=threads,
        persistent_workers=threads > 0,
        pin_memory=torch.device(device).type == "cuda",
        generator=torch.Generator().manual_seed(seed * 1000 + rank),
    )
    target = torch.device(device)
    for images, labels in loader:
        yield images.to(target, non_blocking=True), labels.to(target, non_blocking=True)
