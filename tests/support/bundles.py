"""Read bundles and forge altered copies of them, with or without checksums that match."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from ralp_pipe.results.bundle import CHECKSUMS


def members(path: Path) -> dict[str, bytes]:
    """Contents of every regular member of a bundle, by member name."""
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def forge(source: Path, target: Path, change: dict[str, bytes], checksums: bool = True) -> Path:
    """Copy bundle `source` to `target` with the members named in `change` replaced or added (as plain files).

    With `checksums`, SHA256SUMS is rewritten to match every file, as a careful forger would;
    without it, SHA256SUMS is copied as it was.
    """
    top = next(iter(contents := members(source))).partition("/")[0]
    listing = f"{top}/{CHECKSUMS}"
    with tarfile.open(source) as old:
        entries = [(m, change.get(m.name, contents.get(m.name))) for m in old.getmembers()]
    names = {m.name for m, _ in entries}
    entries += [(tarfile.TarInfo(name), data) for name, data in change.items() if name not in names]
    if checksums:
        files = {m.name: data for m, data in entries if m.isfile() and m.name != listing}
        sums = "".join(
            f"{hashlib.sha256(data).hexdigest()}  {name.removeprefix(top + '/')}\n"
            for name, data in sorted(files.items())
            if data is not None
        )
        entries = [(m, sums.encode() if m.name == listing else data) for m, data in entries]
    with tarfile.open(target, "w:gz") as new:
        for member, data in entries:
            if data is not None:
                member.size = len(data)
            new.addfile(member, None if data is None else io.BytesIO(data))
    return target
