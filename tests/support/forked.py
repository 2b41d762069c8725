"""Targets for children forked by :func:`ralp_pipe.runtime.process.start_forked` (picklable by name)."""

from __future__ import annotations

import gc
import os
import signal
import sys


def report(code: int) -> None:
    """Print this child's pid, session and parent, then exit with `code`."""
    print(f"pid {os.getpid()} session {os.getsid(0)} parent {os.getppid()}", flush=True)
    sys.exit(code)


def fail() -> None:
    """Raise: the child's exit status is 1 and the traceback lands in its log."""
    raise ValueError("a bad value in the forked child")


def frozen() -> None:
    """Print how many objects the garbage collector leaves alone (inherited from the server)."""
    print(f"frozen {gc.get_freeze_count()} collected {sum(gc.get_count())}", flush=True)


def blocked() -> None:
    """Print the signals blocked in this child (the server runs with SIGINT and SIGTERM blocked)."""
    print("blocked", *sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
