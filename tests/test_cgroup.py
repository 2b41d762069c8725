"""The memory cgroup ranks live under: its limit (v2 and v1, on the process's own cgroup or above it), and
a rank the OOM killer took named as killed for memory (fake cgroup files; one real run where root can make one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ralp_pipe.runtime import cgroup

GB = 1_000_000_000
V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _v2(root: Path, own: str = "/slurm/job_7/step_0", mount_root: str = "/") -> Path:
    """A cgroup v2 machine whose job cgroup (SLURM's --mem) holds the limit, its step none of its own."""
    top = "sys/fs/cgroup"
    return _files(
        root,
        {
            "proc/self/cgroup": f"0::{own}\n",
            "proc/self/mountinfo": f"24 1 0:22 {mount_root} /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
            f"{top}/cgroup.controllers": "cpuset cpu io memory pids\n",
            f"{top}/slurm/memory.max": "max\n",
            f"{top}/slurm/job_7/memory.max": f"{6 * GB}\n",
            f"{top}/slurm/job_7/memory.peak": f"{int(5.97 * GB)}\n",
            f"{top}/slurm/job_7/step_0/memory.max": "max\n",
            f"{top}/slurm/job_7/step_0/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\noom_group_kill 0\n",
        },
    )


def test_a_v2_limit_set_above_the_process_s_own_cgroup_binds(tmp_path: Path) -> None:
    found = cgroup.memory_cgroup(_v2(tmp_path))
    assert found is not None and found.version == 2
    assert found.folder == tmp_path / "sys/fs/cgroup/slurm/job_7/step_0"
    assert (found.limit_bytes, found.limit_folder) == (6 * GB, tmp_path / "sys/fs/cgroup/slurm/job_7")
    assert found.peak_bytes() == int(5.97 * GB) and found.oom_kills() == 0


def test_the_lowest_limit_on_the_way_up_binds(tmp_path: Path) -> None:
    root = _files(_v2(tmp_path), {"sys/fs/cgroup/slurm/memory.max": f"{2 * GB}\n"})
    found = cgroup.memory_cgroup(root)
    assert found is not None and (found.limit_bytes, found.limit_folder) == (2 * GB, root / "sys/fs/cgroup/slurm")


def test_a_container_s_mount_of_its_own_cgroup_is_followed(tmp_path: Path) -> None:
    root = _files(tmp_path, {"sys/fs/cgroup/cgroup.controllers": "memory\n", "sys/fs/cgroup/memory.max": "4096\n"})
    found = cgroup.memory_cgroup(_v2(root, own="/docker/abc", mount_root="/docker/abc"))
    assert found is not None and found.folder == root / "sys/fs/cgroup" and found.limit_bytes == 4096


def test_v1_memory_controller_beside_an_empty_v2_hierarchy(tmp_path: Path) -> None:
    top = "sys/fs/cgroup/memory"
    root = _files(
        tmp_path,
        {
            "proc/self/cgroup": "9:name=systemd:/\n4:memory:/jobs/job_3\n1:cpu:/\n0::/\n",
            "proc/self/mountinfo": V1_MOUNTS,
            "sys/fs/cgroup/unified/cgroup.controllers": "hugetlb\n",
            f"{top}/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
            f"{top}/jobs/memory.limit_in_bytes": "9223372036854771712\n",
            f"{top}/jobs/job_3/memory.limit_in_bytes": f"{3 * GB}\n",
            f"{top}/jobs/job_3/memory.max_usage_in_bytes": f"{3 * GB - 4096}\n",
            f"{top}/jobs/job_3/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        },
    )
    found = cgroup.memory_cgroup(root)
    assert found is not None and found.version == 1 and found.folder == root / top / "jobs/job_3"
    assert found.limit_bytes == 3 * GB and found.oom_kills() == 2 and found.peak_bytes() == 3 * GB - 4096
    assert cgroup.oom_note(found, 2) is None
    note = cgroup.oom_note(found, 1)
    assert note == (
        f"killed for memory: peak 3.00 GB of 3.00 GB allowed ({root / top / 'jobs/job_3'}/memory.limit_in_bytes); "
        f"1 OOM kill(s) in cgroup {root / top / 'jobs/job_3'}"
    )


def test_no_limit_and_no_memory_controller(tmp_path: Path) -> None:
    unlimited = cgroup.memory_cgroup(_files(_v2(tmp_path), {"sys/fs/cgroup/slurm/job_7/memory.max": "max\n"}))
    assert unlimited is not None and unlimited.limit_bytes is None and unlimited.limit_folder is None
    _files(tmp_path, {"sys/fs/cgroup/cgroup.controllers": "cpu pids\n"})
    assert cgroup.memory_cgroup(tmp_path) is None
    assert cgroup.memory_cgroup(tmp_path / "nothing") is None


# A supervisor that moves itself into the cgroup given, then supervises one child that wants 1 GB.
SUPERVISED = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from ralp_pipe.errors import RunFailure
    from ralp_pipe.runtime import cgroup, process
    Path(sys.argv[1], "cgroup.procs").write_text(str(os.getpid()))
    print("limit", cgroup.memory_cgroup().limit_bytes)
    log = Path(sys.argv[2])
    hog = process.start_logged([sys.executable, "-c", "print('allocating', flush=True); b = b'x' * (1 << 30)"], log)
    try:
        process.supervise([hog], [log], 120, "rank")
    except RunFailure as exc:
        print(str(exc).splitlines()[0])
    """
)
LIMIT = 256 << 20


def _small_cgroup(tmp_path: Path) -> Path:
    """A cgroup below this process's own, limited to LIMIT bytes (skips where root cannot make one here)."""
    own = cgroup.memory_cgroup()
    if os.geteuid() != 0 or own is None:
        pytest.skip("needs root and a memory cgroup")
    folder = own.folder / f"ralp-pipe-test-{os.getpid()}"
    limit = "memory.max" if own.version == 2 else "memory.limit_in_bytes"
    try:
        folder.mkdir()
        (folder / limit).write_text(str(LIMIT))
    except OSError as exc:
        if folder.exists():
            folder.rmdir()
        pytest.skip(f"cannot make a limited memory cgroup under {own.folder}: {exc.strerror}")
    for swap in ("memory.swap.max", "memory.memsw.limit_in_bytes"):  # no swapping out of the limit
        try:
            (folder / swap).write_text("0" if swap.endswith("max") else str(LIMIT))
        except OSError:
            pass
    return folder


@pytest.mark.slow
def test_a_rank_the_oom_killer_takes_in_a_small_cgroup_is_named_killed_for_memory(tmp_path: Path) -> None:
    folder = _small_cgroup(tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", SUPERVISED, str(folder), str(tmp_path / "rank0.log")],
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        folder.rmdir()  # empty once the supervisor exited
    assert done.returncode == 0, done.stderr
    limit, message = done.stdout.splitlines()
    assert limit == f"limit {LIMIT}"
    assert "rank 0 exited with status -9 (killed by SIGKILL; killed for memory: peak" in message, message
    assert f"of 0.27 GB allowed ({folder}/" in message and f"1 OOM kill(s) in cgroup {folder})" in message, message
