"""Find the images of a source collection: ImageNet class folders or one tar per synset."""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ralp_pipe.errors import DataError

SYNSET = re.compile(r"^n\d{8}$")
END_OF_ARCHIVE = bytes(2 * tarfile.BLOCKSIZE)  # two zero blocks close every tar


class SourceError(DataError):
    """A source collection or file that cannot be used; the message names it."""


@dataclass(frozen=True)
class SourceImage:
    """One candidate image: where its bytes are and what identifies its version."""

    ref: str  # path relative to the source root; "<synset>.tar/<member>" inside a tar
    synset: str
    path: str  # file holding the bytes
    offset: int  # start of the bytes in `path` (0 for plain files)
    size: int
    mtime_ns: int

    def location(self) -> str:
        """Full path of the file, or of the tar plus the member name, for messages."""
        return self.path if self.path.endswith(self.ref) else f"{self.path} (member {self.ref.partition('/')[2]})"


@dataclass
class Scan:
    """Everything found under a source root: candidate images, classes and what was passed over."""

    images: list[SourceImage] = field(default_factory=list)
    synsets: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # "<ref>: <reason>" of unreadable folders and tars

    def skip(self, ref: str, reason: str, damaged: bool = False) -> None:
        """Record an entry that is not used, with the reason; `damaged` marks data that could not be read."""
        self.skipped.append({"path": ref, "reason": reason})
        if damaged:
            self.damaged.append(f"{ref}: {reason}")


def scan(root: Path, layout: str) -> Scan:
    """List the images under `root` in `layout` ("folders" or "tars"), sorted by synset then name."""
    if not os.access(root, os.R_OK | os.X_OK) or not root.is_dir():
        raise SourceError(f"source folder {root} is missing or unreadable: check dataset.source")
    result = Scan()
    for entry in _sorted_entries(root, root, result):
        if layout == "folders":
            _scan_folder_entry(root, entry, result)
        else:
            _scan_tar_entry(entry, result)
    result.images.sort(key=lambda image: (image.synset, image.ref))
    result.synsets = sorted({image.synset for image in result.images} | set(result.synsets))
    return result


def read_bytes(image: SourceImage) -> bytes:
    """The stored bytes of `image` (short if the file was truncated)."""
    with open(image.path, "rb") as handle:
        handle.seek(image.offset)
        return handle.read(image.size)


def _sorted_entries(folder: Path, root: Path, result: Scan) -> list[os.DirEntry[str]]:
    """Non-hidden entries of `folder` sorted by name; hidden ones are recorded as skipped."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        if folder == root:
            raise SourceError(f"cannot list the source folder {root}: {exc}") from exc
        result.skip(_rel(folder, root), f"cannot list folder: {exc.strerror or exc}", damaged=True)
        return []
    visible = []
    for entry in entries:
        if entry.name.startswith("."):
            result.skip(_rel(Path(entry.path), root), "hidden entry")
        else:
            visible.append(entry)
    return visible


def _scan_folder_entry(root: Path, entry: os.DirEntry[str], result: Scan) -> None:
    """A top-level entry of the class-folder layout: a synset folder of images, or something stray."""
    rel = entry.name
    if not entry.is_dir():
        result.skip(rel, "file at the top level (expected synset folders only)")
        return
    if not SYNSET.match(entry.name):
        result.skip(rel, "folder name is not a synset id like n01440764")
        return
    result.synsets.append(entry.name)
    for item in _sorted_entries(Path(entry.path), root, result):
        item_rel = f"{rel}/{item.name}"
        if not item.is_file():
            result.skip(item_rel, "not a regular file inside a class folder")
            continue
        try:
            stat = item.stat()
        except OSError as exc:
            result.skip(item_rel, f"cannot stat: {exc.strerror or exc}", damaged=True)
            continue
        result.images.append(SourceImage(item_rel, entry.name, item.path, 0, stat.st_size, stat.st_mtime_ns))


def _scan_tar_entry(entry: os.DirEntry[str], result: Scan) -> None:
    """A top-level entry of the per-synset tar layout: `<synset>.tar`, or something stray."""
    rel = entry.name
    synset, dot, ext = entry.name.partition(".")
    if not entry.is_file() or not dot or ext != "tar":
        result.skip(rel, "not a <synset>.tar file")
        return
    if not SYNSET.match(synset):
        result.skip(rel, "tar name is not a synset id like n01440764.tar")
        return
    stat = entry.stat()
    result.synsets.append(synset)
    try:
        with tarfile.open(entry.path, "r:") as archive:
            complete = _read_members(archive, rel, result)
            for member in archive.members:  # type: ignore[attr-defined]  # read by _read_members
                _add_tar_member(member, rel, synset, entry.path, stat.st_mtime_ns, result)
            if complete:
                _check_tar_end(entry.path, archive, stat.st_size, rel, result)
    except (tarfile.TarError, OSError) as exc:
        result.skip(rel, f"cannot read tar: {exc}", damaged=True)


def _add_tar_member(member: tarfile.TarInfo, rel: str, synset: str, path: str, mtime_ns: int, result: Scan) -> None:
    """Record one member of a synset tar as a candidate image, or as skipped with the reason."""
    name = member.name
    member_rel = f"{rel}/{name}"
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        result.skip(member_rel, "unsafe path (absolute or with a '..' part)")
    elif any(part.startswith(".") for part in parts):
        result.skip(member_rel, "hidden entry")
    elif not member.isfile():
        if not member.isdir():
            result.skip(member_rel, "not a regular file inside the tar")
    else:
        result.images.append(SourceImage(member_rel, synset, path, member.offset_data, member.size, mtime_ns))


def _check_tar_end(path: str, archive: tarfile.TarFile, size: int, rel: str, result: Scan) -> None:
    """Record the fully read `archive` as damaged unless two zero blocks follow its last member, as they end a tar.

    tarfile reads a missing or cut header as the end of the archive, so a tar cut at a block
    boundary or inside a header would otherwise lose its remaining members without a word.
    """
    members = archive.members  # type: ignore[attr-defined]  # those read so far (not in the stubs)
    last = members[-1] if members else None
    end = archive.offset  # where tarfile looked for the next header: just after the last member's data
    with open(path, "rb") as handle:
        handle.seek(end)
        trailer = handle.read(len(END_OF_ARCHIVE))
    if trailer != END_OF_ARCHIVE:
        after = f"after member {last.name!r}" if last else "at the start"
        result.skip(
            rel,
            f"truncated tar: {path} has no end-of-archive blocks {after} (offset {end} of {size} bytes); "
            f"members after it are lost: download or copy the tar again",
            damaged=True,
        )


def _read_members(archive: tarfile.TarFile, rel: str, result: Scan) -> bool:
    """Read member headers up to the first damaged one (a damaged tar keeps what precedes it); False if damaged."""
    try:
        while archive.next() is not None:
            pass
    except tarfile.TarError as exc:
        result.skip(rel, f"tar damaged after {len(archive.members)} members: {exc}", damaged=True)  # type: ignore[attr-defined]
        return False
    return True


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
