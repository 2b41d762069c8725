"""A real SLURM cluster of K nodes on this machine: ``ralp-pipe cluster up|down|status``.

For tests, demos and CI (as root; ``scripts/setup-system.sh`` installs slurmctld, slurmd,
slurm-client and munge, nothing here installs anything). Built from the emulated network
(:class:`ralp_pipe.runtime.emulated.EmulatedCluster`): node ``nI`` is host ``I-1``, a network
namespace whose ``eth0`` (``10.213.0.I``) hangs on a bridge through a link shaped by ``tc tbf``
to `rate` in both directions. One unshaped veth joins the bridge to this machine's own
namespace at ``10.213.0.254``, where slurmctld, a munged of the cluster's own (its socket in
:func:`munge_folder`; unix sockets reach across network namespaces) and the clients (sbatch,
squeue, snakemake) run. Each slurmd runs inside its node's network namespace, in a mount and UTS
namespace of its own: hostname ``nI``, a hosts file naming every node over ``/etc/hosts`` and
the cluster's config folder over ``/etc/slurm`` (job steps find it there).

``cluster up`` starts a *keeper* process that owns all of it and prints the ``SLURM_CONF`` to
export; ``cluster down`` stops the keeper, which cancels the jobs and stops, by the PIDs it
started, every slurmd, what is left in the node namespaces, slurmctld and munged, deletes the
link and the route below and then the namespaces, the munge folder and the cluster's folder.
The slurm daemons die with the keeper (parent-death signal; munged, running as the munge user,
does not); a ``down`` or ``up`` that finds a keeper gone (killed) stops what it left by the
PIDs recorded in the cluster's ``state.json`` and removes the rest (and names what it removed).
``cluster status`` shows every node's SLURM state, link byte counters and the PID of a process in
its network namespace: the namespaces are unnamed (``ip netns list`` does not list them), so
``nsenter -t PID -n`` is the way in.

Network safety: while the cluster is up, the machine's namespace has an ``unreachable`` route
for ``10.213.0.0/16``, so no packet for the cluster's subnet ever follows the default route
off the machine, even while the cluster's own link is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ralp_pipe.atomic import write_json_atomic
from ralp_pipe.errors import ConfigError, RunFailure
from ralp_pipe.runtime.emulated import SUBNET, EmulatedCluster
from ralp_pipe.runtime.process import Process, free_port, start_logged, stop, tail
from ralp_pipe.runtime.wire import LinkCounters, interface_counters

MODULE = "ralp_pipe.runtime.slurm_cluster"  # run with --serve: the keeper
DEFAULT_DIR = Path(tempfile.gettempdir()) / "ralp-pipe-slurm"
STATE_FILE = "state.json"
CONTROL_ADDRESS = f"{SUBNET}.254"  # this machine's end of the cluster network (slurmctld, clients)
GUARD_ROUTE = "10.213.0.0/16"  # unreachable in this machine's namespace while a cluster is up
ROOT_LINK = "ralp-slurm0"  # this machine's end of the unshaped control link
SWITCH_PORT = "sc"  # its bridge end
PARTITION = "ralp"
PROGRAMS = ("slurmctld", "slurmd", "munged", "sinfo", "squeue", "sbatch", "srun", "scontrol", "scancel", "setpriv")
INSTALL_HINT = "as root: bash scripts/setup-system.sh (apt-get install slurmctld slurmd slurm-client munge)"
MUNGE_USER = "munge"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


def _program(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")
    if found is None:
        raise ConfigError(f"{name} is not installed; {INSTALL_HINT}")
    return found


def munge_folder(folder: Path) -> Path:
    """Where the munged of the cluster in `folder` keeps its socket: a folder the munge user can reach
    (the cluster's own folder may sit below one it cannot enter, such as a 0700 temporary folder)."""
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"ralp-pipe-munge-{digest}"


def node_name(index: int) -> str:
    """SLURM name (and hostname) of node `index` (0-based): n1, n2, ..."""
    return f"n{index + 1}"


def running(pid: int) -> bool:
    """True while process `pid` exists and has not exited (an exited one waiting to be reaped does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _net_namespace(pid: int) -> int | None:
    """Inode of the network namespace of `pid` (None when it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _pids_in_namespaces(inodes: set[int]) -> list[int]:
    """Processes inside the network namespaces `inodes` (made by a cluster of this module: all ours)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _net_namespace(int(entry)) in inodes:
            pids.append(int(entry))
    return pids


def _kill_pids(pids: Sequence[int], grace_s: float = 5.0) -> None:
    """SIGTERM `pids` (by PID), SIGKILL those left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RunFailure(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _refuse_second_cluster() -> None:
    """One cluster per machine: its control link and route have fixed names."""
    if _link_exists(ROOT_LINK):
        raise ConfigError(
            f"network link {ROOT_LINK} already exists: another ralp-pipe cluster is up on this machine; "
            f"`ralp-pipe cluster status --dir FOLDER` shows it, `ralp-pipe cluster down --dir FOLDER` stops it"
        )


def _remove_network_leftovers() -> None:
    """Delete the control link and the guard route of this machine's namespace, where present."""
    if _link_exists(ROOT_LINK):
        _ip("link", "del", ROOT_LINK, check=False)
    _ip("route", "del", "unreachable", GUARD_ROUTE, check=False)


@dataclass(frozen=True)
class ClusterState:
    """What ``state.json`` of a cluster folder records (written by the keeper)."""

    state: str  # starting | up | stopping | failed
    keeper: int
    nodes: int
    rate: str
    slurm_conf: str
    namespaces: list[int]  # network namespace inodes of the nodes (to find processes left in them)
    daemons: dict[str, int]
    message: str = ""

    @staticmethod
    def read(folder: Path) -> "ClusterState | None":
        """The state of the cluster in `folder`, or None when there is none."""
        try:
            return ClusterState(**json.loads((folder / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def keeper_alive(self) -> bool:
        """True when the keeper process of this state still runs (and is a keeper, not a reused PID)."""
        try:
            argv = Path(f"/proc/{self.keeper}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return MODULE.encode() in argv and b"--serve" in argv


class SlurmCluster:
    """Owns the namespaces, daemons, link and route of one cluster in `folder` (run by the keeper)."""

    def __init__(self, folder: Path, nodes: int, rate: str, burst: str = "1mb") -> None:
        if not 1 <= nodes <= 200:
            raise ConfigError(f"--nodes {nodes}: a cluster on this machine has 1..200 nodes")
        self.folder, self.nodes, self.rate = folder.resolve(), nodes, rate
        self.network = EmulatedCluster(nodes, rate, burst)
        self.conf = self.folder / "etc" / "slurm.conf"
        self.cpus = max(1, os.cpu_count() or 1)  # per node; slurmd refuses more than the machine has
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        self.memory_mb = max(500, int(total_mb * 0.8) // nodes)  # the nodes' sum stays below the machine's
        self.munge_socket = munge_folder(self.folder) / "munge.socket"
        self.daemons: dict[str, Process] = {}
        self._owns_network = False  # the control link and the guard route are this cluster's to remove

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Build the network, write the config, start munged, slurmctld and every slurmd; wait for idle nodes."""
        for name in PROGRAMS:
            _program(name)
        _refuse_second_cluster()
        self._owns_network = True
        for sub in ("etc", "state", "log", *(f"spool/{node_name(i)}" for i in range(self.nodes))):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        _ip("route", "replace", "unreachable", GUARD_ROUTE)
        self.network.start()
        self._control_link()
        self._write_config()
        self._write_hosts_file()
        self._start_munge()
        self.daemons["slurmctld"] = self._daemon("slurmctld", [_program("slurmctld"), "-D", "-f", str(self.conf)])
        for i in range(self.nodes):
            self.daemons[node_name(i)] = self._daemon(node_name(i), self._slurmd_command(i))
        self._wait_idle()

    def stop(self) -> None:
        """Cancel every job and stop everything :meth:`start` made, by PID; remove the folder."""
        ctld = self.daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self._cancel_jobs()
        stop([proc for name, proc in self.daemons.items() if name.startswith("n")])
        holders = set(self.network.namespace_pids())
        _kill_pids([pid for pid in _pids_in_namespaces(set(self.namespaces())) if pid not in holders])  # job steps
        stop([proc for name, proc in self.daemons.items() if not name.startswith("n")])
        self.daemons = {}
        if self._owns_network:  # never another cluster's (a start refused because one is up)
            _remove_network_leftovers()
        self.network.close()
        shutil.rmtree(self.munge_socket.parent, ignore_errors=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def namespaces(self) -> list[int]:
        """Network namespace inodes of the nodes."""
        return [ino for pid in self.network.namespace_pids() if (ino := _net_namespace(pid)) is not None]

    def failed_daemons(self) -> list[str]:
        """Daemons that exited while the cluster was up."""
        return [name for name, proc in self.daemons.items() if proc.poll() is not None]

    # -- pieces -----------------------------------------------------------------------------------
    def _control_link(self) -> None:
        """An unshaped veth from the bridge into this machine's namespace, holding CONTROL_ADDRESS."""
        result = self.network.switch_run(
            [
                "sh",
                "-c",
                f"ip link add {SWITCH_PORT} type veth peer name {ROOT_LINK} netns {os.getpid()} && "
                f"ip link set {SWITCH_PORT} master br0 && ip link set {SWITCH_PORT} up",
            ]
        )
        if result.returncode != 0:
            raise RunFailure(f"cannot link the cluster network to this machine: {result.stderr.strip()}")
        _ip("addr", "add", f"{CONTROL_ADDRESS}/24", "dev", ROOT_LINK)
        _ip("link", "set", ROOT_LINK, "up")

    def _write_hosts_file(self) -> None:
        lines = ["127.0.0.1 localhost", f"{CONTROL_ADDRESS} {socket.gethostname()}"]
        lines += [f"{self.network.address(i)} {node_name(i)}" for i in range(self.nodes)]
        (self.folder / "hosts").write_text("\n".join(lines) + "\n")

    def _write_config(self) -> None:
        f = self.folder
        nodes = [
            f"NodeName={node_name(i)} NodeAddr={self.network.address(i)} CPUs={self.cpus} Sockets=1 "
            f"CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={self.memory_mb} State=UNKNOWN"
            for i in range(self.nodes)
        ]
        lines = [
            "ClusterName=ralpnodes",
            f"SlurmctldHost={socket.gethostname()}({CONTROL_ADDRESS})",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=300",
            "DefMemPerCPU=1000",
            "MailProg=/bin/true",
            f"StateSaveLocation={f}/state",
            f"SlurmdSpoolDir={f}/spool/%n",
            f"SlurmctldPidFile={f}/slurmctld.pid",
            f"SlurmdPidFile={f}/slurmd-%n.pid",
            f"SlurmctldLogFile={f}/log/slurmctld.log",
            f"SlurmdLogFile={f}/log/slurmd-%n.log",
            *nodes,
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _start_munge(self) -> None:
        """Our own munged, its socket in :func:`munge_folder` (owned by munge, mode 0755 as munged requires)."""
        munge_dir = self.munge_socket.parent
        shutil.rmtree(munge_dir, ignore_errors=True)  # a killed cluster's
        munge_dir.mkdir(mode=0o755)
        shutil.chown(munge_dir, MUNGE_USER, MUNGE_USER)
        argv = [
            _program("setpriv"), f"--reuid={MUNGE_USER}", f"--regid={MUNGE_USER}", "--init-groups",
            _program("munged"), "--foreground", f"--socket={self.munge_socket}",
            f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log", f"--seed-file={munge_dir}/seed",
        ]  # fmt: skip
        self.daemons["munged"] = self._daemon("munged", argv)
        self._wait(lambda: self.munge_socket.exists(), "munged", f"{munge_dir}/munged.log")

    def _slurmd_command(self, index: int) -> list[str]:
        """slurmd -D inside node `index`: its network namespace, own hostname, hosts file and /etc/slurm."""
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" /etc/slurm && exec "$4" -D -f "$5"'
        args = [node_name(index), str(self.folder / "hosts"), str(self.conf.parent), _program("slurmd"), str(self.conf)]
        unshare = ["unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", script, "sh", *args]
        return [*self.network.prefix(index), *unshare]

    def _daemon(self, name: str, argv: list[str]) -> Process:
        return start_logged(argv, self.folder / "log" / f"{name}.out")

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _client(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=self._client_env())

    def _wait(self, ready: Any, what: str, log: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            failed = self.failed_daemons()
            if failed or time.monotonic() > deadline:
                why = f"{', '.join(failed)} exited" if failed else f"not ready after {timeout_s:.0f} s"
                logs = [Path(log), *(self.folder / "log" / f"{name}.out" for name in failed)]
                shown = "\n".join(f"{path}:\n{tail(path, 10)}" for path in logs if path.exists())
                raise RunFailure(f"{what}: {why}; the cluster is removed again. Last lines of its logs:\n{shown}")
            time.sleep(0.05)

    def node_states(self) -> dict[str, str]:
        """SLURM state of every node (``sinfo``), empty when slurmctld does not answer."""
        out = self._client("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[::2], out[1::2]))

    def _wait_idle(self) -> None:
        self._wait(
            lambda: list(self.node_states().values()) == ["idle"] * self.nodes,
            f"{self.nodes} idle nodes",
            f"{self.folder}/log/slurmctld.log",
        )

    def _cancel_jobs(self) -> None:
        """Cancel the jobs and wait up to 20 s for them to end; give up where slurmctld does not answer."""
        deadline = time.monotonic() + 20
        try:
            self._client("scancel", "--full", "--quiet", f"--partition={PARTITION}", timeout_s=10)
            while self._client("squeue", "-h", "-o", "%i", timeout_s=10).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        except subprocess.SubprocessError:
            pass  # the daemons are stopped next and the job steps with the node namespaces


# -- the keeper --------------------------------------------------------------------------------------
def _serve(folder: Path, nodes: int, rate: str, burst: str) -> int:
    """The keeper: start the cluster, record its state, keep it until SIGTERM/SIGINT, then tear it down."""
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = SlurmCluster(folder, nodes, rate, burst)

    def record(state: str, message: str = "") -> None:
        daemons = {name: proc.pid for name, proc in cluster.daemons.items()}
        doc = ClusterState(state, os.getpid(), nodes, rate, str(cluster.conf), cluster.namespaces(), daemons, message)
        write_json_atomic(folder / STATE_FILE, doc.__dict__)

    folder.mkdir(parents=True, exist_ok=True)
    record("starting")
    try:
        cluster.start()
        record("up")
        while not stopping:
            failed = cluster.failed_daemons()
            if failed:
                record("failed", f"{', '.join(failed)} exited; see {folder}/log/")
            time.sleep(0.5)
    except (ConfigError, RunFailure) as exc:
        print(exc, file=sys.stderr)  # `up` shows it
        return 1
    finally:
        cluster.stop()
    return 0


# -- the commands -------------------------------------------------------------------------------------
def clean_stale(folder: Path) -> list[str]:
    """Remove what a killed keeper of `folder` left (processes in its namespaces, link, route, folder)."""
    state = ClusterState.read(folder)
    removed = []
    if state is not None:
        if state.keeper_alive():
            raise ConfigError(f"a cluster is up in {folder} (keeper PID {state.keeper}); use it or stop it first")
        leftovers = _pids_in_namespaces(set(state.namespaces))
        if leftovers:
            _kill_pids(leftovers)
            removed.append(f"{len(leftovers)} processes")
        for name, pid in state.daemons.items():  # a daemon outside the namespaces (slurmctld, munged)
            if running(pid) and _started_here(pid, folder):
                _kill_pids([pid])
                removed.append(name)
        if not _live_keepers():  # the link and route are another cluster's while one is up
            if _link_exists(ROOT_LINK):
                removed.append(ROOT_LINK)
            _remove_network_leftovers()
    shutil.rmtree(munge_folder(folder), ignore_errors=True)
    if folder.exists():
        if state is None and not (folder / "etc" / "slurm.conf").exists() and any(folder.iterdir()):
            raise ConfigError(f"--dir {folder} exists and is not a cluster's folder; name a new or empty one")
        shutil.rmtree(folder)
        removed.append(str(folder))
    return removed


def _live_keepers() -> list[int]:
    """PIDs of the cluster keepers running on this machine."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.isdigit() and MODULE.encode() in argv and b"--serve" in argv and running(int(entry)):
            found.append(int(entry))
    return found


def _started_here(pid: int, folder: Path) -> bool:
    """True when `pid` runs with this cluster's folder or munge folder on its command line (one of its daemons)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(str(path).encode() in argv for path in (folder, munge_folder(folder)))


def up(folder: Path, nodes: int, rate: str, burst: str) -> ClusterState:
    """Start a keeper for a cluster in `folder` and wait until its nodes are idle."""
    if os.geteuid() != 0:
        raise ConfigError("ralp-pipe cluster up needs root (network namespaces, slurmd, munge key)")
    for name in PROGRAMS:
        _program(name)
    removed = clean_stale(folder)
    if removed:
        print(f"removed leftovers of an earlier cluster: {', '.join(removed)}", file=sys.stderr)
    if not folder.parent.is_dir():
        raise ConfigError(f"--dir {folder}: its parent folder does not exist")
    _refuse_second_cluster()
    log = Path(tempfile.mkstemp(prefix="ralp-pipe-cluster-", suffix=".log")[1])
    argv = [sys.executable, "-m", MODULE, "--serve", str(folder), str(nodes), rate, burst]
    with open(log, "wb") as out:  # not tied to this process: the cluster outlives the command
        keeper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            state = ClusterState.read(folder)
            if keeper.poll() is not None:
                raise RunFailure(f"the cluster did not come up: {log.read_text().strip()[-2000:]}")
            if state is not None and state.state == "up":
                return state
            time.sleep(0.05)
        down(folder)
        raise RunFailure(f"the cluster did not come up within {START_TIMEOUT_S + STOP_TIMEOUT_S:.0f} s")
    finally:
        log.unlink(missing_ok=True)


def down(folder: Path) -> tuple[bool, list[str]]:
    """Stop the cluster in `folder` (SIGTERM to its keeper), then remove whatever is left: whether a keeper ran,
    and the leftovers removed (none after a clean teardown)."""
    state = ClusterState.read(folder)
    was_up = state is not None and state.keeper_alive()
    if state is not None and was_up:
        os.kill(state.keeper, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while state.keeper_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if state.keeper_alive():
            os.kill(state.keeper, signal.SIGKILL)  # its daemons die with it (parent-death signal)
            time.sleep(0.5)
    return was_up, clean_stale(folder)


def status(folder: Path) -> dict[str, Any]:
    """State, nodes (SLURM state, link counters, the PID holding each node's network namespace) and SLURM_CONF
    of the cluster in `folder`."""
    state = ClusterState.read(folder)
    if state is None or not state.keeper_alive():
        return {"state": "down", "folder": str(folder)}
    doc: dict[str, Any] = {**state.__dict__, "folder": str(folder)}
    if state.state == "up":
        env = {**os.environ, "SLURM_CONF": state.slurm_conf}
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env).stdout
        doc["node_states"] = dict(zip(out.split()[::2], out.split()[1::2]))
        holders = namespace_holders(state)
        doc["namespace_pids"] = {node_name(i): pid for i, pid in enumerate(holders)}
        doc["links"] = {node_name(i): node_link(pid).__dict__ for i, pid in enumerate(holders)}
    return doc


def namespace_holders(state: ClusterState) -> list[int]:
    """Per node, a process inside its network namespace (the namespaces are unnamed: ``nsenter -t PID -n``)."""
    holders: dict[int | None, int] = {}
    for pid in _pids_in_namespaces(set(state.namespaces)):
        holders.setdefault(_net_namespace(pid), pid)
    return [holders[ino] for ino in state.namespaces]


def node_link(holder: int) -> LinkCounters:
    """The kernel's byte counters, now, of ``eth0`` in the network namespace of process `holder`."""
    return interface_counters(f"/proc/{holder}/net/dev")


def node_counters(state: ClusterState) -> list[LinkCounters]:
    """Per node, the kernel's byte counters of its ``eth0`` now."""
    return [node_link(pid) for pid in namespace_holders(state)]


def describe(doc: dict[str, Any]) -> str:
    """:func:`status` as lines of text: the cluster, then per node its SLURM state, namespace PID and link bytes."""
    if doc["state"] == "down":
        return f"no cluster is up in {doc['folder']}"
    lines = [f"{doc['state']}: {doc['nodes']} nodes at {doc['rate']}; export SLURM_CONF={doc['slurm_conf']}"]
    for node, pid in doc.get("namespace_pids", {}).items():
        link = doc["links"][node]
        lines.append(
            f"{node}  {doc['node_states'].get(node, '?'):8s} namespace of PID {pid:<8d} "
            f"eth0 tx {link['tx_bytes']} B, rx {link['rx_bytes']} B"
        )
    if doc.get("namespace_pids"):
        lines.append("the node namespaces are unnamed (not in `ip netns list`): `nsenter -t PID -n ip addr` enters one")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ralp-pipe cluster up|down|status`` options."""
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--nodes", type=int, default=4, help="nodes of the cluster (up; default 4)")
    parser.add_argument("--rate", default="1gbit", help="tc rate of every node link, e.g. 1gbit (up)")
    parser.add_argument("--burst", default="1mb", help="tc burst of every node link (up)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"the cluster's folder (default {DEFAULT_DIR})")
    parser.add_argument("--json", action="store_true", help="status as JSON")


def main(args: argparse.Namespace) -> int:
    """Run one cluster action; `status` returns 1 when no cluster is up."""
    folder = Path(args.dir).absolute()
    if args.overrides:
        raise ConfigError(f"ralp-pipe cluster takes no Hydra overrides, got {' '.join(args.overrides)}")
    if args.action == "up":
        began = time.monotonic()
        state = up(folder, args.nodes, args.rate, args.burst)
        print(f"{state.nodes} nodes up at {state.rate} per link in {time.monotonic() - began:.1f} s", file=sys.stderr)
        print(f"export SLURM_CONF={state.slurm_conf}")
        return 0
    if args.action == "down":
        began = time.monotonic()
        was_up, removed = down(folder)
        done = f"cluster down in {time.monotonic() - began:.1f} s" if was_up else f"no cluster was up in {folder}"
        print(f"{done}; removed leftovers: {', '.join(removed)}" if removed else done)
        return 0
    doc = status(folder)
    print(json.dumps(doc, indent=1) if args.json else describe(doc))
    return 0 if doc["state"] == "up" else 1


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        sys.exit(_serve(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]))
    sys.exit("usage: ralp-pipe cluster up|down|status (this module's --serve is the keeper it starts)")
