"""The lock file of one holder at a time: refused at once while held, removed on release, free after a killed holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ralp_pipe.locks import LockHeld, exclusive

HOLDER = """
import sys, time
from pathlib import Path
from ralp_pipe.locks import exclusive
with exclusive(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    """A child process holding the lock `path` for a minute."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    return proc


def test_a_held_lock_is_refused_at_once_naming_its_holder_and_is_removed_when_released(tmp_path: Path) -> None:
    path = tmp_path / ".run.lock"
    holder = _holder(path)
    try:
        with pytest.raises(LockHeld) as held:
            with exclusive(path):
                pytest.fail("two holders at once")
        assert (held.value.path, held.value.holder) == (path, str(holder.pid))
    finally:
        holder.terminate()
        holder.wait()
    assert not path.exists() or path.read_text() == f"{holder.pid}\n"  # SIGTERM kills it before its finally
    with exclusive(path):
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()


def test_a_lock_file_left_by_a_killed_holder_locks_nothing(tmp_path: Path) -> None:
    path = tmp_path / ".run.lock"
    holder = _holder(path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert path.read_text() == f"{holder.pid}\n"  # left behind, but the kernel dropped its lock
    with exclusive(path):
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()


def test_a_taker_never_holds_a_file_its_holder_removed(tmp_path: Path) -> None:
    """Between a taker's open and its lock the holder may release and remove the file; the taker then
    locks the file now at the path, so a third process cannot hold a second one at the same time."""
    path = tmp_path / ".run.lock"
    stale = os.open(path, os.O_RDWR | os.O_CREAT)  # what the taker opened before the holder removed it
    os.unlink(path)
    opened = os.open
    calls = []

    def open_once_stale(file: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        calls.append(file)
        return os.dup(stale) if len(calls) == 1 else opened(file, flags, mode)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "open", open_once_stale)
            with exclusive(path):
                assert path.exists() and len(calls) == 2
                with pytest.raises(LockHeld):
                    with exclusive(path):
                        pass
    finally:
        os.close(stale)
    assert not path.exists()
