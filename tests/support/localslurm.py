"""A real single-node SLURM on this machine (Debian's slurmctld, slurmd and munge), for tests and trials.

    python tests/support/localslurm.py start FOLDER   # as root; config, state, logs and pids in FOLDER
    snakemake --cores all --profile slurm --config experiment=smoke
    python tests/support/localslurm.py stop FOLDER

No accounting (use the executor plugin's ``squeue`` status command), no cgroups, one node named
after this host with `cpus` CPUs declared (``SlurmdParameters=config_overrides`` lets it declare
more than it has, so a 3-rank run fits on 2 cores). ``/etc/slurm/slurm.conf`` must exist inside
job steps, so it is linked to FOLDER's config while the cluster runs and unlinked on stop.
Everything is stopped by the PIDs this module recorded; a munged that was already running is
used and left alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MUNGE_SOCKET_DIR = Path("/run/munge")
MUNGE_PID = MUNGE_SOCKET_DIR / "munged.pid"
COMMANDS = ("slurmctld", "slurmd", "munged", "sinfo", "squeue", "sbatch", "srun", "scontrol", "scancel")
INSTALL_HINT = "install them as root with: apt-get install -y slurmctld slurmd slurm-client munge"


def _unlink_stale_system_conf() -> None:
    """Remove a link to /etc/slurm left by a cluster of this module that was killed before its stop.

    Such a link points at a folder holding this module's PID files; it is stale when the target is
    gone or no slurmctld recorded there is alive. A real file, or a link to a live cluster, is kept.
    """
    if not SYSTEM_CONF.is_symlink():
        return
    target = Path(os.readlink(SYSTEM_CONF))
    ctld = _read_pid(target.parent / "slurmctld.pid")
    if not target.exists() or ((target.parent / "slurmctld.pid").exists() and not (ctld and _alive(ctld))):
        print(f"removing stale {SYSTEM_CONF} -> {target} (its cluster is not running)", file=sys.stderr)
        SYSTEM_CONF.unlink()


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be started here; the message says what is missing and how to install it."""


def missing_commands() -> list[str]:
    """SLURM and munge programs that are not on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [name for name in COMMANDS if shutil.which(name, path=path) is None]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pid(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM `pid`, wait, then SIGKILL it if it is still there."""
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _sbin(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")
    if found is None:
        raise SlurmUnavailable(f"{name} is not installed; {INSTALL_HINT}")
    return found


class LocalSlurm:
    """Start and stop slurmctld, slurmd (and munged if none runs) with state under `folder`."""

    def __init__(self, folder: Path, cpus: int = 8, memory_mb: int | None = None, partition: str = "local") -> None:
        self.folder = Path(folder).resolve()
        self.cpus, self.partition = cpus, partition
        # Below the machine's memory, as slurmd refuses a node that declares more than it has.
        self.memory_mb = memory_mb or int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8 / 2**20)
        self.conf = self.folder / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]

    @property
    def pid_files(self) -> dict[str, Path]:
        """Where each daemon started here records its PID."""
        return {
            "slurmd": self.folder / "slurmd.pid",
            "slurmctld": self.folder / "slurmctld.pid",
            "munged": self.folder / "munged.pid",
        }

    def config_text(self) -> str:
        """slurm.conf of the one-node cluster."""
        f = self.folder
        return "\n".join(
            [
                "ClusterName=ralplocal",
                "SlurmctldHost=localhost",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "SlurmUser=root",
                "AuthType=auth/munge",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                "SlurmdParameters=config_overrides",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "JobCompType=jobcomp/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "MinJobAge=300",
                "DefMemPerCPU=1000",
                "MailProg=/bin/true",
                f"StateSaveLocation={f}/state",
                f"SlurmdSpoolDir={f}/spool",
                f"SlurmctldPidFile={self.pid_files['slurmctld']}",
                f"SlurmdPidFile={self.pid_files['slurmd']}",
                f"SlurmctldLogFile={f}/slurmctld.log",
                f"SlurmdLogFile={f}/slurmd.log",
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
                f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def start(self, timeout_s: float = 30.0) -> None:
        """Write the config, link it into /etc/slurm, start the daemons and wait for an idle node."""
        missing = missing_commands()
        if missing:
            raise SlurmUnavailable(f"SLURM programs missing: {', '.join(missing)}; {INSTALL_HINT}")
        if os.geteuid() != 0:
            raise SlurmUnavailable("starting slurmctld/slurmd needs root (SlurmUser=root, munge key access)")
        _unlink_stale_system_conf()
        if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
            raise SlurmUnavailable(f"{SYSTEM_CONF} already exists (another SLURM?): stop it or remove the file first")
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.config_text())
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        try:
            self._start_munge()
            self._daemon("slurmctld", [_sbin("slurmctld"), "-f", str(self.conf)])
            self._daemon("slurmd", [_sbin("slurmd"), "-f", str(self.conf)])
            self._wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        running = _read_pid(MUNGE_PID)
        if running and _alive(running):
            return
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", str(MUNGE_SOCKET_DIR)], check=True)
        subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged")], check=True, timeout=30)
        pid = self._wait_pid_file(MUNGE_PID, "munged")
        self.pid_files["munged"].write_text(f"{pid}\n")

    def _daemon(self, name: str, command: list[str]) -> None:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise SlurmUnavailable(f"{name} did not start ({result.stderr.strip()}); see {self.folder}/{name}.log")
        self._wait_pid_file(self.pid_files[name], name)

    def _wait_pid_file(self, path: Path, name: str, timeout_s: float = 15.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = _read_pid(path)
            if pid and _alive(pid):
                return pid
            time.sleep(0.05)
        raise SlurmUnavailable(f"{name} wrote no live PID to {path} within {timeout_s:.0f} s; see {self.folder}")

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise SlurmUnavailable(
            f"node {self.node} is {state or 'unknown'!r}, not idle, after {timeout_s:.0f} s; "
            f"see {self.folder}/slurmd.log and slurmctld.log"
        )

    def stop(self) -> None:
        """Cancel jobs, stop the daemons this object started (by PID) and unlink /etc/slurm/slurm.conf."""
        slurmctld = _read_pid(self.pid_files["slurmctld"])
        if slurmctld and _alive(slurmctld):
            subprocess.run(["scancel", "--full", "--quiet", "--user=root"], capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while (
                time.monotonic() < deadline
                and subprocess.run(
                    ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
                ).stdout.strip()
            ):
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = _read_pid(self.pid_files[name])
            if pid:
                _stop_pid(pid)
                self.pid_files[name].unlink(missing_ok=True)
        if SYSTEM_CONF.is_symlink() and Path(os.readlink(SYSTEM_CONF)) == self.conf:
            SYSTEM_CONF.unlink()

    def __enter__(self) -> "LocalSlurm":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """`python tests/support/localslurm.py start|stop FOLDER`."""
    parser = argparse.ArgumentParser(prog="python tests/support/localslurm.py", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("folder", type=Path, help="folder for slurm.conf, state, logs and PID files")
    parser.add_argument("--cpus", type=int, default=8, help="CPUs the node declares")
    args = parser.parse_args(argv)
    cluster = LocalSlurm(args.folder, cpus=args.cpus)
    try:
        if args.action == "start":
            cluster.start()
            print(
                f"SLURM running: partition {cluster.partition}, node {cluster.node}; stop with "
                f"python tests/support/localslurm.py stop {cluster.folder}"
            )
        else:
            cluster.stop()
    except SlurmUnavailable as exc:
        print(f"localslurm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
