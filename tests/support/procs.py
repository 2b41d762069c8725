"""Looking at this machine's processes from /proc: what the tests check is left running."""

from __future__ import annotations

import os
from pathlib import Path


def pids() -> list[int]:
    """Every process on this machine."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def cmdline(pid: int) -> str:
    """The command line of `pid`, arguments separated by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _open_paths(pid: int) -> list[str]:
    """Where `pid`'s open files and working folder point ([] once it is gone or unreadable)."""
    links = [Path(f"/proc/{pid}/cwd")]
    try:
        links += list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []
    paths = []
    for link in links:
        try:
            paths.append(str(link.readlink()))
        except OSError:
            continue
    return paths


def processes_using(path: str) -> list[int]:
    """Live processes that mention `path` on their command line or hold a file below it open (a forked
    rank's command line is its server's, but it holds its rank log)."""
    return [
        pid
        for pid in pids()
        if pid != os.getpid() and (path in cmdline(pid) or any(p.startswith(path) for p in _open_paths(pid)))
    ]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first), [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def children(pid: int) -> list[int]:
    """Direct children of `pid`."""
    return [child for child in pids() if (fields := _stat(child)) and int(fields[1]) == pid]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def group(pgid: int) -> list[int]:
    """Live processes (zombies excluded) of process group `pgid`."""
    return [pid for pid in pids() if (fields := _stat(pid)) and fields[0] != "Z" and int(fields[2]) == pgid]
