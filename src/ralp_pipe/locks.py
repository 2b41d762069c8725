"""An exclusive lock held through a lock file (``fcntl.flock``), released and removed on any exit.

The kernel drops a ``flock`` when its holder exits, however it exits (even SIGKILL), so a lock
file left by a killed holder locks nothing: the next taker locks it and removes it when done.
The file holds its holder's PID, for messages naming who holds it.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator


class LockHeld(Exception):
    """Another process holds the lock; `holder` is its PID as the lock file says (or ``unknown``)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by PID {holder}")
        self.path = path
        self.holder = holder


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock of file `path` (created if absent) until the block ends, then remove the file.

    Refuses at once with :class:`LockHeld` when another process holds it. The file is removed
    while still locked, and a taker that locked a file already removed (or replaced) by its
    holder takes the new one instead, so two processes never both hold `path`.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockHeld(path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # the holder removed it between our open and our lock: take the file now at `path`
    try:
        with suppress(OSError):  # the PID only names the holder in messages; a full disk must not stop the lock
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # still ours: never remove another holder's file
                os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)
