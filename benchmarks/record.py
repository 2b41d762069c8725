"""A benchmark's figures written as a documentation record (``docs/records/<name>.json``, read by cog blocks).

    from record import write_record
    write_record(path, {"figure": 1.23})   # command, revision, date and machine filled in

``make docs`` then writes every README and docs block that quotes the record again.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

from ralp_pipe.atomic import write_json_atomic

REPO = Path(__file__).resolve().parents[1]


def revision() -> str:
    """The checkout's short commit, ``-dirty`` appended where tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    """The cores, memory and GPUs of this machine, in words."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return f"{os.cpu_count()} cores, {memory:.0f} GiB, " + (f"{gpus} GPU(s)" if gpus else "no GPU")


def record_of(figures: dict[str, Any], note: str | None = None, command: str | None = None) -> dict[str, Any]:
    """A record of `figures` made by `command` (default: the command running now, from its argv) at this
    revision, today, on this machine."""
    command = command or "python " + shlex.join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
    data: dict[str, Any] = {"command": command, "revision": revision(), "date": date.today().isoformat()}
    data["machine"] = machine()
    if note:
        data["note"] = note
    return {**data, "figures": figures}


def write_record(path: Path, figures: dict[str, Any], note: str | None = None, command: str | None = None) -> None:
    """Write :func:`record_of` `figures` to `path` (atomically)."""
    write_json_atomic(path, record_of(figures, note, command))
    print(f"record written: {path} (run `make docs` to regenerate the pages quoting it)")
