"""Emulated cluster: one network namespace per host behind a rate-limited switch.

Topology: a *switch* namespace holds bridge ``br0``; host ``i`` is a namespace whose ``eth0``
(``10.213.0.{i+1}/24``) is one end of a veth pair, the other end ``s{i}`` sits on the bridge.
``tc tbf`` shapes both directions of every host link: ``eth0`` egress is the upload,
``s{i}`` egress the download (where a parameter server's fan-in queues up).

Each namespace is held by a tiny holder process (``cat`` reading a pipe from this process).
Closing the cluster, an exception, Ctrl-C or even SIGKILL of this process closes the pipe, the
holders exit and the kernel removes the namespaces with their interfaces. Nothing is named,
mounted or created in the machine's own namespaces, so runs never collide or leave state.

As root the namespaces are plain network namespaces; without root (where unprivileged user
namespaces exist) they live in a user namespace created by ``unshare --user --map-root-user``.
Commands run inside host ``i`` through the argv prefix :meth:`EmulatedCluster.prefix`
(``nsenter``); ranks, forked rather than executed, enter the same namespace files
(:meth:`EmulatedCluster.namespaces`) with :func:`ralp_pipe.runtime.sites.enter_namespaces`. Both
get the environment :meth:`EmulatedCluster.env` (``GLOO_SOCKET_IFNAME=eth0``, ``MASTER_ADDR`` = host 0,
and the host's index for its link counters, :mod:`ralp_pipe.runtime.wire`).

Hosts of G GPUs (``cluster.gpus_per_node`` G > 1, :func:`ralp_pipe.contract.topology.placement`): a host is one namespace
holding its G ranks, which share its one shaped link (network.rate / D), as a real host's GPUs share its
NIC; ranks fill hosts as :func:`ralp_pipe.contract.topology.on_hosts` lays them out, RALP's PS device where
the plan priced it faster. Traffic between ranks of one host takes the namespace's loopback
(:data:`INTRA_HOST_ROUTE`): unshaped, at what this machine's cores copy, not at the interconnect's
rate / D; metrics.json's ``intra_host`` says so (docs/method/dilation.md gives the measured rates).
`ps` and `dtf` (``variable_update=distributed_replicated``) sum a host's gradients before one push per host,
as the cost model prices them (:mod:`ralp_pipe.engine.strategies.ps`): over that loopback where the ranks
compute, priced at the interconnect's rate x D and waited for where they are modelled (:data:`HOST_SUMS`);
`dtf` has one PS task per worker host there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from ralp_pipe.config import Config, ConfigError
from ralp_pipe.config.dilation import computes_for_real
from ralp_pipe.config.units import rate_bits_per_s, size_bytes
from ralp_pipe.contract.topology import PS_DEVICE, PS_DEVICE_HOSTS, Topology
from ralp_pipe.runtime.sites import RankSite, Sites, nsenter_argv
from ralp_pipe.runtime.wire import HOST_ENV, INTERFACE

SUBNET = "10.213.0"  # private /24 that exists only inside the emulated namespaces
SWITCH_ENV = "RALP_PIPE_EMULATION"  # set to "off" to refuse emulation (forces the loopback fallback)
TOOLS = ("unshare", "nsenter", "ip", "tc", "cat", "sh")
MAX_HOSTS = 250
# how ranks of one emulated host exchange data: over their namespace's loopback, unshaped
INTRA_HOST_ROUTE = "loopback"
# how a host's sums of `ps` and `dtf` ran: copied over the loopback (ranks computing) or priced and waited for
HOST_SUMS = {True: "copied", False: "priced"}


class EmulationUnavailable(ConfigError):
    """Network namespaces cannot be created here; the message says why and what to do instead."""

    def __str__(self) -> str:
        return (
            f"{super().__str__()} (in the workflow: --config experiment=smoke runs every stage on the unshaped "
            f"loopback; an emulated experiment's figures need its shaped links, which a dilated run's factor slows)"
        )


def _privilege_mode() -> str:
    """ "root" (plain network namespaces) or "rootless" (inside an unprivileged user namespace)."""
    return "root" if os.geteuid() == 0 else "rootless"


def _check_switch() -> None:
    if os.environ.get(SWITCH_ENV, "").lower() in ("0", "off", "no", "false"):
        raise EmulationUnavailable(
            f"network emulation is switched off by {SWITCH_ENV}={os.environ[SWITCH_ENV]}; "
            f"unset it, or use cluster=local"
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise EmulationUnavailable(
            f"cluster=emulated needs {', '.join(missing)} on PATH (packages util-linux and iproute2); "
            f"install them, or use cluster=local"
        )


class EmulatedCluster:
    """Context manager owning `hosts` namespaces linked through a switch shaped to `rate` per link."""

    def __init__(self, hosts: int, rate: str = "unlimited", burst: str = "1mb", latency: str = "100ms") -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ConfigError(f"an emulated cluster needs 1..{MAX_HOSTS} hosts, got {hosts}")
        rate_bits_per_s(rate, "network.rate")
        size_bytes(burst, "network.burst")
        self.hosts, self.rate, self.burst, self.latency = hosts, rate, burst, latency
        self.mode = _privilege_mode()
        self._switch: subprocess.Popen[bytes] | None = None
        self._holders: list[subprocess.Popen[bytes]] = []

    # -- life cycle ---------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Create the namespaces, the bridge, the links and their rate limits."""
        _check_switch()
        try:
            unshare = ["unshare", "--net"]
            if self.mode == "rootless":
                unshare = ["unshare", "--user", "--map-root-user", "--net"]
            self._switch = self._spawn_holder(unshare)
            into_user = self._user_prefix(self._switch.pid)
            self._holders = [self._spawn_holder([*into_user, "unshare", "--net"]) for _ in range(self.hosts)]
            self._configure()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the holder processes; the kernel then removes namespaces, veths and qdiscs."""
        for proc in [*self._holders, *([self._switch] if self._switch else [])]:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()
        for proc in [*self._holders, *([self._switch] if self._switch else [])]:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._holders, self._switch = [], None

    def _spawn_holder(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv sh -c 'echo; exec cat'``: its namespaces live exactly as long as our pipe."""
        proc = subprocess.Popen(
            [*argv, "--", "sh", "-c", "echo ready; exec cat >/dev/null"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        if proc.stdout.readline().strip() != b"ready":
            proc.wait(timeout=5)
            reason = proc.stderr.read().decode(errors="replace").strip()
            raise EmulationUnavailable(
                f"cannot create a network namespace ({' '.join(argv)}: {reason or 'exit ' + str(proc.returncode)}); "
                + (
                    "run as root or allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
                    "kernel.unprivileged_userns_clone=1), or use cluster=local"
                    if self.mode == "rootless"
                    else "the kernel or container forbids network namespaces; use cluster=local"
                )
            )
        proc.stderr.close()
        return proc

    # -- commands inside the namespaces ----------------------------------------------------------
    def _user_prefix(self, pid: int) -> list[str]:
        return ["nsenter", f"--target={pid}", "--user", "--preserve-credentials"] if self.mode == "rootless" else []

    def _enter(self, pid: int) -> list[str]:
        return nsenter_argv(self._namespace_files(pid))

    def _namespace_files(self, pid: int) -> tuple[str, ...]:
        kinds = ("user", "net") if self.mode == "rootless" else ("net",)
        return tuple(f"/proc/{pid}/ns/{kind}" for kind in kinds)

    def _batch(self, pid: int, tool: str, lines: Sequence[str]) -> None:
        result = subprocess.run(
            [*self._enter(pid), tool, "-batch", "-"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise EmulationUnavailable(
                f"setting up the emulated network failed ({tool}: {result.stderr.strip()}); "
                f"check that veth, bridge and tbf (sch_tbf) are available, or use cluster=local"
            )

    def _configure(self) -> None:
        assert self._switch is not None
        shape = [] if self.rate == "unlimited" else [f"rate {self.rate} burst {self.burst} latency {self.latency}"]
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for i, holder in enumerate(self._holders):
            switch += [
                f"link add s{i} type veth peer name {INTERFACE} netns {holder.pid}",
                f"link set s{i} master br0",
                f"link set s{i} up",
            ]
        self._batch(self._switch.pid, "ip", switch)
        for i, holder in enumerate(self._holders):
            self._batch(
                holder.pid,
                "ip",
                [
                    "link set lo up",
                    f"addr add {self.address(i)}/24 dev {INTERFACE}",
                    f"link set {INTERFACE} up",
                ],
            )
            if shape:
                self._batch(holder.pid, "tc", [f"qdisc add dev {INTERFACE} root tbf {shape[0]}"])
        if shape:
            self._batch(self._switch.pid, "tc", [f"qdisc add dev s{i} root tbf {shape[0]}" for i in range(self.hosts)])

    def address(self, host: int) -> str:
        """IPv4 address of `host`'s ``eth0``."""
        self._check_host(host)
        return f"{SUBNET}.{host + 1}"

    def prefix(self, host: int) -> list[str]:
        """Argv prefix that runs a command inside `host`'s network namespace."""
        return nsenter_argv(self.namespaces(host))

    def namespaces(self, host: int) -> tuple[str, ...]:
        """The namespace files a process enters, in order, to be on `host` (see :func:`~ralp_pipe.runtime.sites.enter_namespaces`)."""
        self._check_host(host)
        return self._namespace_files(self._holders[host].pid)

    def env(self, host: int, master_host: int = 0) -> dict[str, str]:
        """Environment for a rank on `host`: gloo bound to ``eth0``, rendezvous at `master_host`."""
        self._check_host(host)
        return {"GLOO_SOCKET_IFNAME": INTERFACE, "MASTER_ADDR": self.address(master_host), HOST_ENV: str(host)}

    def share(self, hosts_of_ranks: Sequence[int], master_host: int) -> list[dict[str, Any]]:
        """Where a child launcher puts rank r: host ``hosts_of_ranks[r]`` of this cluster (its namespaces,
        environment and rank 0's address), as JSON-ready values for ``ralp-pipe train --shared-hosts``."""
        return [
            {
                "namespaces": list(self.namespaces(host)),
                "env": self.env(host, master_host),
                "master_addr": self.address(master_host),
            }
            for host in hosts_of_ranks
        ]

    def run(self, host: int, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside `host` and return its completed process (stdout/stderr captured)."""
        return subprocess.run([*self.prefix(host), *argv], capture_output=True, text=True, timeout=timeout)

    def switch_run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the switch namespace (e.g. ``tc -s qdisc show``)."""
        if self._switch is None:
            raise RuntimeError("the emulated cluster is not started; use it as a context manager")
        return subprocess.run([*self._enter(self._switch.pid), *argv], capture_output=True, text=True, timeout=timeout)

    def namespace_pids(self) -> list[int]:
        """PIDs of the processes holding each host's namespace (host order)."""
        return [holder.pid for holder in self._holders]

    def _check_host(self, host: int) -> None:
        if not self._holders:
            raise RuntimeError("the emulated cluster is not started; use it as a context manager")
        if not 0 <= host < self.hosts:
            raise IndexError(f"host {host} does not exist: the emulated cluster has hosts 0..{self.hosts - 1}")
        if self._holders[host].poll() is not None:
            raise RuntimeError(f"the namespace holder of host {host} exited ({self._holders[host].returncode})")


@contextmanager
def emulated_sites(
    hosts: Sequence[int], rate: str, burst: str, shared: Sequence[Mapping[str, Any]] | None = None
) -> Iterator[Sites]:
    """Where each rank of one emulated run starts (the `sites` of ``launch_local``); rank r on ``hosts[r]``.

    Inside a shared cluster (`shared`: what :meth:`EmulatedCluster.share` gave, e.g. the `concurrent`
    stage) the ranks join its hosts; otherwise a cluster with one host per distinct
    entry of `hosts` and `rate` per link is built for the run, and removed afterwards. Ranks
    sharing a host (a colocated PS beside its worker) share its namespace and shaped link.
    """
    if shared is not None:
        ranks = list(shared)
        if len(ranks) != len(hosts):
            raise ConfigError(
                f"--shared-hosts places {len(ranks)} ranks but this run has {len(hosts)}; "
                f"the job's strategy or cluster.gpus differ from what the shared cluster was laid out for"
            )
        try:
            sites = [RankSite(tuple(r["namespaces"]), dict(r["env"]), str(r["master_addr"])) for r in ranks]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"--shared-hosts lacks or mistypes {exc} of a rank: pass what `EmulatedCluster.share` gives"
            ) from None
        yield sites.__getitem__
        return
    with EmulatedCluster(max(hosts) + 1, rate, burst) as cluster:
        yield lambda rank: RankSite(
            cluster.namespaces(hosts[rank]), cluster.env(hosts[rank]), cluster.address(hosts[0])
        )


def intra_host_record(cfg: Config, topo: Topology) -> dict[str, Any] | None:
    """metrics.json's ``intra_host`` for a run on emulated hosts of several GPUs: the hosts, each rank's host, how
    ranks of one host exchanged data (:data:`INTRA_HOST_ROUTE`) and where RALP's PS device was; None at one GPU
    per host."""
    gpus_per_node = cfg.cluster.gpus_per_node
    if gpus_per_node == 1:
        return None
    record: dict[str, Any] = {
        "gpus_per_node": gpus_per_node,
        "hosts": topo.num_hosts,
        "host_of_rank": list(topo.hosts),
        "route": INTRA_HOST_ROUTE,
        "how": "ranks of one host exchange over their namespace's loopback, unshaped (not slowed to the "
        "interconnect's rate / D); only the host's link is shaped",
        "interconnect": cfg.interconnect.name,  # what the plan priced inside a host, at this bandwidth
        "interconnect_gbytes_per_s": cfg.interconnect.gbytes_per_s,
        # where ps or dtf sum a host's gradients (and share its pulls): copied over the loopback, or, modelled,
        # priced at the interconnect's rate x D and waited for (engine/strategies/ps.py HostLeaderClient)
        "host_sums": HOST_SUMS[computes_for_real(cfg)],
    }
    if PS_DEVICE in topo.roles:
        device = topo.roles.index(PS_DEVICE)
        beside = any(topo.hosts[w] == topo.hosts[device] for w in topo.workers)
        record["ps_device_host"] = PS_DEVICE_HOSTS[beside]
    return record
