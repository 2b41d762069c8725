"""The memory cgroup this process and the ranks it starts live in (v2 or v1): its limit and its OOM kills.

SLURM's ``--mem``, a container's memory limit or a systemd slice bound a job by its cgroup, not by
the machine's memory, and the limit may sit on any cgroup above the process's own. The ranks of a
local run are children of the driver and live in its cgroup. Every function takes the filesystem
root (tests pass a folder of fake ``proc`` and ``sys`` files).

| | v2 | v1 |
|---|---|---|
| limit | ``memory.max`` (``max``: none) | ``memory.limit_in_bytes`` |
| OOM kills | ``memory.events``: ``oom_kill N`` (counts descendants) | ``memory.oom_control``: ``oom_kill N`` |
| peak | ``memory.peak`` (Linux 5.19 and later) | ``memory.max_usage_in_bytes`` |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")
_FILES = {
    2: {"limit": "memory.max", "events": "memory.events", "peak": "memory.peak"},
    1: {"limit": "memory.limit_in_bytes", "events": "memory.oom_control", "peak": "memory.max_usage_in_bytes"},
}
UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as the largest page-aligned 64-bit count


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup of a process: its folder, and the folder (itself or an ancestor) whose limit binds."""

    version: int
    folder: Path
    limit_folder: Path | None  # None: no cgroup on the way to the hierarchy's root sets a limit
    limit_bytes: int | None

    def _read(self, folder: Path, key: str) -> str | None:
        try:
            return (folder / _FILES[self.version][key]).read_text()
        except OSError:
            return None

    def oom_kills(self) -> int:
        """Processes of this cgroup the OOM killer has killed so far (0 where the kernel does not say)."""
        for line in (self._read(self.folder, "events") or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def peak_bytes(self) -> int | None:
        """The highest memory use the limiting cgroup (else this one) has seen, where the kernel records it."""
        text = (self._read(self.limit_folder or self.folder, "peak") or "").strip()
        return int(text) if text.isdigit() else None


def _own_paths(root: Path, pid: str) -> dict[str, str]:
    """Controller list -> the process's cgroup path, from /proc/PID/cgroup (v2's line has an empty list)."""
    paths = {}
    for line in (root / "proc" / pid / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        paths[controllers] = path
    return paths


def _mounts(root: Path, pid: str) -> list[tuple[str, str, str, str]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount, from /proc/PID/mountinfo."""
    mounts = []
    for line in (root / "proc" / pid / "mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        parts, extra = fields.split(), rest.split()
        if len(parts) >= 5 and len(extra) >= 3 and extra[0] in ("cgroup", "cgroup2"):
            mounts.append((extra[0], parts[3], parts[4], extra[2]))
    return mounts


def _folder(root: Path, mount_root: str, mount_point: str, path: str) -> Path:
    """The folder of cgroup `path` under a mount of hierarchy folder `mount_root` at `mount_point`."""
    inside = path[len(mount_root) :] if mount_root != "/" and path.startswith(mount_root) else path
    return root / mount_point.lstrip("/") / inside.lstrip("/")


def memory_cgroup(root: Path = ROOT, pid: str = "self") -> MemoryCgroup | None:
    """The memory cgroup process `pid` lives in and the lowest limit on it and its ancestors; None where there is
    no memory controller (or /proc cannot be read)."""
    try:
        own, mounts = _own_paths(root, pid), _mounts(root, pid)
    except (OSError, ValueError):
        return None
    v1 = next((path for controllers, path in own.items() if "memory" in controllers.split(",")), None)
    for fstype, mount_root, mount_point, options in mounts:
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            return _with_limit(1, _folder(root, mount_root, mount_point, v1), root / mount_point.lstrip("/"))
        if v1 is None and fstype == "cgroup2" and "" in own:
            top = root / mount_point.lstrip("/")
            try:
                controllers = (top / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if "memory" in controllers:
                return _with_limit(2, _folder(root, mount_root, mount_point, own[""]), top)
    return None


def _with_limit(version: int, folder: Path, top: Path) -> MemoryCgroup:
    """`folder`'s cgroup with the lowest limit set on it or an ancestor below the hierarchy's root `top`."""
    limit: tuple[int, Path] | None = None
    here = folder
    while True:
        try:
            text = (here / _FILES[version]["limit"]).read_text().strip()
        except OSError:
            text = ""
        if text.isdigit() and int(text) < UNLIMITED_V1 and (limit is None or int(text) < limit[0]):
            limit = (int(text), here)
        if here == top or top not in here.parents:
            break
        here = here.parent
    return MemoryCgroup(version, folder, None if limit is None else limit[1], None if limit is None else limit[0])


def oom_note(cgroup: MemoryCgroup | None, kills_before: int) -> str | None:
    """Words for OOM kills in `cgroup` since it counted `kills_before`: how much its processes used of how much
    they may; None where there were none."""
    if cgroup is None:
        return None
    kills = cgroup.oom_kills() - kills_before
    if kills <= 0:
        return None
    peak = cgroup.peak_bytes()
    used = "" if peak is None else f"peak {peak / 1e9:.2f} GB"
    allowed = (
        "the machine's memory"
        if cgroup.limit_bytes is None
        else f"{cgroup.limit_bytes / 1e9:.2f} GB allowed ({cgroup.limit_folder}/{_FILES[cgroup.version]['limit']})"
    )
    return f"killed for memory: {used + ' of ' if used else ''}{allowed}; {kills} OOM kill(s) in cgroup {cgroup.folder}"
