"""Webdataset tar shards and their DALI index files (format "v1.2": `<ext> <offset> <size> <name>` per member)."""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

INDEX_VERSION = "v1.2"


@dataclass(frozen=True)
class Member:
    """One file of a sample inside a shard: where its bytes start and how many there are."""

    ext: str
    offset: int
    size: int
    name: str


@dataclass(frozen=True)
class Sample:
    """A `key.jpg` + `key.cls` pair to store in a shard."""

    key: str
    jpeg: bytes
    label_text: bytes


def tar_bytes(samples: Sequence[Sample]) -> bytes:
    """A reproducible uncompressed tar of `samples` (fixed mtime, owner and mode; members in order)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for sample in samples:
            for ext, payload in (("jpg", sample.jpeg), ("cls", sample.label_text)):
                info = tarfile.TarInfo(f"{sample.key}.{ext}")
                info.size, info.mode, info.mtime = len(payload), 0o644, 0
                archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def index_text(data: bytes) -> str:
    """The DALI webdataset index of the tar held in `data` (one line per sample, members grouped by key)."""
    lines: list[str] = []
    current = None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for info in archive:
            if not info.isfile():
                continue
            key, _, ext = info.name.rpartition("/")[2].partition(".")
            entry = f"{ext} {info.offset_data} {info.size} {info.name}"
            if key == current:
                lines[-1] += " " + entry
            else:
                lines.append(entry)
                current = key
    return "\n".join([f"{INDEX_VERSION} {len(lines)}", *lines]) + "\n"


def read_index(path: Path) -> list[dict[str, Member]]:
    """Parse an index file into one {ext: Member} dict per sample, in shard order."""
    lines = path.read_text().splitlines()
    header = lines[0].split() if lines else []
    if len(header) != 2 or header[0] != INDEX_VERSION or int(header[1]) != len(lines) - 1:
        raise ValueError(f"index file {path} does not start with '{INDEX_VERSION} <samples>' matching its lines")
    samples = []
    for line in lines[1:]:
        fields = line.split()
        members = [Member(e, int(o), int(s), n) for e, o, s, n in zip(*[iter(fields)] * 4)]
        samples.append({m.ext: m for m in members})
    return samples
