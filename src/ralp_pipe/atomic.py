"""Atomic file writes: write under a temporary name in the target's folder, then `os.replace`."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from ralp_pipe.errors import ConfigError, os_problem

Writer = Callable[[Path], object]  # writes one file's contents to the path it is given


@contextmanager
def atomic_paths(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[Path]]:
    """Yield a temporary path next to each of `paths`, all made before the caller writes anything.

    On success every temporary replaces its target, one after the other, only once all were
    written; on error none does and all are removed, so the targets stay as they were.
    """
    targets = [Path(path) for path in paths]
    temps: list[Path] = []
    try:
        for target in targets:
            if target.is_dir():  # os.replace would fail only once others were replaced
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            temps.append(Path(tmp))
            os.chmod(tmp, 0o644)
        yield temps
        for temp, target in zip(temps, targets):
            os.replace(temp, target)
    finally:
        for temp in temps:
            if os.path.exists(temp):
                os.unlink(temp)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it replaces `path`, on error it is removed."""
    with atomic_paths([path]) as (tmp,):
        yield tmp


def write_together(writers: Mapping[Path, Writer]) -> list[Path]:
    """Write every target with its writer, all or none: a failure (an unwritable folder, a full disk, a
    writer's error) leaves every target as it was. Returns the targets."""
    with atomic_paths(list(writers)) as temps:
        for tmp, write in zip(temps, writers.values()):
            write(tmp)
    return list(writers)


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as indented JSON to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_writable(folder: Path, option: str) -> None:
    """Before any work: make `folder` and a file in it, or refuse `option` (the setting naming it) in one line."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{option}: cannot write there: {os_problem(exc, folder)}; choose another {option.partition('=')[0]} "
            f"or fix that path"
        ) from exc
