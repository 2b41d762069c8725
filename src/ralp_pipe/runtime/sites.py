"""Where a rank runs: the host it is placed on (:class:`RankSite`) and entering that host's namespaces.

A host of the emulated network is a set of namespace files (``/proc/PID/ns/net``, and ``user`` where
the namespaces are unprivileged); a command enters them through the argv prefix :func:`nsenter_argv`,
a forked rank with :func:`enter_namespaces`.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

_CLONE = {"user": 0x10000000, "net": 0x40000000}  # setns(2) namespace types: CLONE_NEWUSER, CLONE_NEWNET


@dataclass(frozen=True)
class RankSite:
    """Where one rank runs: the namespace files it enters (in order), extra environment and rank 0's address."""

    namespaces: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"


Sites = Callable[[int], RankSite]  # rank -> its site


def nsenter_argv(namespaces: Sequence[str]) -> list[str]:
    """Argv prefix that runs a command inside `namespaces` (files such as ``/proc/PID/ns/net``, in order)."""
    flags = [f"--{os.path.basename(path)}={path}" for path in namespaces]
    user = any(os.path.basename(path) == "user" for path in namespaces)
    return ["nsenter", *flags, *(["--preserve-credentials"] if user else []), "--"]


def enter_namespaces(namespaces: Sequence[str]) -> None:
    """Move this (single-threaded) process into `namespaces` with setns(2), as ``nsenter`` does before exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    for path in namespaces:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, _CLONE[os.path.basename(path)]) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {path}: {os.strerror(err)}")
        finally:
            os.close(fd)
