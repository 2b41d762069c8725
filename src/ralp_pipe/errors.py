"""The foreseeable failures of ralp-pipe, one type per kind, each with its own exit status.

A stage raises one of these with a message that names the file, key or rank at fault and
what to do; the command line prints ``ralp-pipe <stage>: <kind>: <message>`` on stderr and
exits with the type's ``exit_code``. Anything else is a bug and keeps its traceback. A full or
read-only disk met while writing is unusable data, worded by :func:`disk_error`.
"""

from __future__ import annotations

import errno
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})  # a full (or quota-full) or read-only disk


class RalpError(Exception):
    """Base of every foreseeable failure."""

    exit_code = 1
    kind = "error"


class BundleRefused(RalpError):
    """A bundle (or results folder) that is unsafe, incomplete, tampered with or does not recompute."""

    exit_code = 1
    kind = "REFUSED"


class ConfigError(RalpError, ValueError):
    """A configuration value that cannot be used; the message says which and why."""

    exit_code = 2
    kind = "configuration error"


class DataError(RalpError):
    """Input data (an image source, shards, a profile or plan file) that cannot be used."""

    exit_code = 3
    kind = "data error"


class RunFailure(RalpError):
    """A rank, daemon or child process failed or hung; the message names it and its last log lines."""

    exit_code = 4
    kind = "run failed"


class Interrupted(RalpError):
    """The user stopped the command (Ctrl-C or SIGTERM); nothing half-written is left behind."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.exit_code = 128 + signum

    kind = "stopped"


def os_problem(exc: OSError, path: Path | None = None) -> str:
    """`file: strerror (ERRNO)` of an OSError for one-line messages; `path` where the error names no file."""
    name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else type(exc).__name__
    where = exc.filename or path
    return f"{f'{where}: ' if where else ''}{exc.strerror or exc} ({name})"


def disk_error(exc: OSError, what: str, where: Path | None, advice: str) -> DataError | None:
    """The one-line error for a full or read-only disk met while writing `what` below `where`, else None.

    `advice` says what was kept (the writers of :mod:`ralp_pipe.atomic` leave nothing half-written) and what to do.
    """
    if exc.errno not in DISK_ERRNOS:
        return None
    return DataError(f"cannot write {what}: {os_problem(exc, where)}; {advice}")


@contextmanager
def disk_errors(what: str, where: Path, advice: str) -> Iterator[None]:
    """Turn a full or read-only disk met in the block into :func:`disk_error`'s one line; other errors pass."""
    try:
        yield
    except OSError as exc:
        error = disk_error(exc, what, where, advice)
        if error is None:
            raise
        raise error from exc
