"""The foreseeable failures of ralp-pipe, one type per kind, each with its own exit status.

A stage raises one of these with a message that names the file, key or rank at fault and
what to do; the command line prints ``ralp-pipe <stage>: <kind>: <message>`` on stderr and
exits with the type's ``exit_code``. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


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
