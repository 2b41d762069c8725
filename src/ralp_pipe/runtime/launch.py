"""Starting the ranks of one run: locally as forked processes, or as srun tasks under SLURM.

- :func:`launch_local` runs a :class:`PythonMain` once per rank on this machine: each rank is
  forked from a server that imported the module once (:func:`ralp_pipe.runtime.process.start_forked`),
  in its own process group and killed with its parent. A `sites` function gives each rank a
  :class:`~ralp_pipe.runtime.sites.RankSite`: the namespaces it enters, extra environment and the
  master address, e.g. ``RankSite(("/proc/4242/ns/net",), {"GLOO_SOCKET_IFNAME": "eth0"}, "10.213.0.1")``
  to run rank 1 inside the network namespace held by process 4242.
- :func:`launch_slurm` runs the ranks with ``srun`` inside an allocation, one task per rank on
  its node of the run's placement (:func:`ralp_pipe.runtime.nodes.node_of_ranks`: an srun host file,
  ``--distribution=arbitrary``); every task sees its node's GPUs and a rank computes on the one its placement
  gives it (:func:`ralp_pipe.contract.topology.gpu_slots`); rank 0 meets the
  others on the first node of the job's node list (:mod:`ralp_pipe.runtime.nodes`).
  :func:`RankEnv.from_environ` reads a rank's identity from torchrun-style variables (RANK,
  WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or from SLURM_* variables. An srun task binds gloo and
  NCCL to ``network.interface``, or where none is named to the interface that routes to rank 0's
  node, and reads that interface's byte counters at the window edges (:mod:`ralp_pipe.runtime.wire`).

If any rank exits non-zero, or the run outlives its deadline, every other rank is stopped
(SIGTERM, then SIGKILL after a grace period) and :class:`RunFailure` names the rank and the
cause with the tail of its log (:mod:`ralp_pipe.runtime.process`).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Sequence

import torch.distributed as dist

from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime.nodes import allocation_nodes, first_host
from ralp_pipe.runtime.process import (
    Forked,
    free_port,
    signals_deferred,
    start_forked,
    start_logged,
    stop,
    supervise,
)
from ralp_pipe.runtime.sites import RankSite, Sites, enter_namespaces
from ralp_pipe.runtime.wire import HOST_ENV, LINK_ENV, route_interface


@dataclass(frozen=True)
class PythonMain:
    """What every rank runs: ``module.main(argv)``, whose return value is the rank's exit status."""

    module: str
    argv: tuple[str, ...]

    def command(self) -> list[str]:
        """The same as a command line (``python -m module argv``), for srun."""
        return [sys.executable, "-m", self.module, *self.argv]


@dataclass(frozen=True)
class RankEnv:
    """The identity of one rank and where its group meets."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    node: int | None = None  # srun task: index of its node in the job (SLURM_NODEID)

    @staticmethod
    def from_environ(environ: dict[str, str] | None = None) -> "RankEnv":
        """Read torchrun-style variables, else SLURM_* variables (srun task)."""
        env = dict(os.environ if environ is None else environ)
        if "RANK" in env and "WORLD_SIZE" in env:
            rank = int(env["RANK"])
            return RankEnv(
                rank=rank,
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", rank)),
                master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                master_port=int(env["MASTER_PORT"]),
            )
        if "SLURM_PROCID" in env:
            nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
            if "MASTER_ADDR" not in env and not nodelist:
                raise RunFailure("SLURM task without SLURM_JOB_NODELIST or MASTER_ADDR: cannot find rank 0's host")
            return RankEnv(
                rank=int(env["SLURM_PROCID"]),
                world_size=int(env["SLURM_NTASKS"]),
                local_rank=int(env.get("SLURM_LOCALID", "0")),
                master_addr=env.get("MASTER_ADDR") or first_host(nodelist or ""),
                master_port=int(env.get("MASTER_PORT") or slurm_port(env.get("SLURM_JOB_ID", "0"))),
                node=int(env.get("SLURM_NODEID", "0")),
            )
        raise RunFailure("no rank identity: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT or run under srun")


def slurm_port(job_id: str) -> int:
    """A rendezvous port derived from the job id, so every task of the job agrees on it."""
    return 20000 + int(job_id) % 20000


def init_group(env: RankEnv, backend: str, init_timeout_s: float, timeout_s: float) -> None:
    """Join the process group: rendezvous bounded by `init_timeout_s`, collectives by `timeout_s`."""
    if env.node is not None:
        bind_task_link(env)
    store = dist.TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size,
        is_master=env.rank == 0,
        timeout=timedelta(seconds=init_timeout_s),
    )
    dist.init_process_group(
        backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s)
    )
    dist.barrier()


def rank_log(log_dir: Path, rank: int) -> Path:
    """The file :func:`launch_local` writes rank `rank`'s output to."""
    return log_dir / f"rank{rank}.log"


def srun_log(log_dir: Path) -> Path:
    """The file :func:`launch_slurm` writes every rank's output to (lines labelled by rank)."""
    return log_dir / "srun.log"


def launch_local(
    main: PythonMain,
    world_size: int,
    timeout_s: float,
    log_dir: Path,
    sites: Sites | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run `main` once per rank on this machine (torchrun-style environment) and supervise the ranks."""
    port = free_port()
    procs: list[Forked] = []
    logs: list[Path] = []
    try:
        with signals_deferred():  # a Ctrl-C while the ranks start is handled once every started rank is in procs
            for rank in range(world_size):
                where = sites(rank) if sites else RankSite()
                rank_env = {
                    **os.environ,
                    **(env or {}),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world_size),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(world_size),
                    "MASTER_ADDR": where.master_addr,
                    "MASTER_PORT": str(port),
                    **where.env,
                }
                logs.append(rank_log(log_dir, rank))
                procs.append(start_forked(_run_main, (main, rank_env, where.namespaces), logs[-1], [main.module]))
    except BaseException:
        stop(procs)
        raise
    supervise(procs, logs, timeout_s, "rank")


def _run_main(main: PythonMain, env: dict[str, str], namespaces: tuple[str, ...]) -> None:
    """A forked rank: enter its host's namespaces, take its environment, run `main` and exit with its status."""
    enter_namespaces(namespaces)
    os.environ.clear()
    os.environ.update(env)
    sys.exit(importlib.import_module(main.module).main(list(main.argv)))


def in_slurm_step(world_size: int, environ: dict[str, str] | None = None) -> bool:
    """True when this process is one of `world_size` srun tasks (so it is a rank itself)."""
    env = os.environ if environ is None else environ
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and env.get("SLURM_NTASKS") == str(world_size)


def launch_slurm(
    main: PythonMain,
    node_of_rank: Sequence[int],
    timeout_s: float,
    log_dir: Path,
    interface: str | None = None,
) -> None:
    """Run `main` as one srun task per rank, rank r on node ``node_of_rank[r]`` of the allocation; supervise srun.

    `interface` (``network.interface``) is the one gloo and NCCL bind to; None lets every task
    find the interface that routes to rank 0's node.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        raise RunFailure(
            "cluster=slurm outside a SLURM allocation (no SLURM_JOB_ID): submit with sbatch/salloc or use cluster=local"
        )
    nodes, needed = allocation_nodes(job), max(node_of_rank) + 1
    if len(nodes) < needed:
        raise RunFailure(
            f"the {len(node_of_rank)} ranks are placed on {needed} nodes but SLURM job {job} has {len(nodes)} "
            f"({', '.join(nodes)}); submit it with --nodes={needed} (the workflow's train rule asks for that many)"
        )
    hostfile = log_dir / "hostfile"
    hostfile.write_text("".join(f"{nodes[node]}\n" for node in node_of_rank))
    srun = ["srun", f"--ntasks={len(node_of_rank)}", f"--nodes={needed}", "--distribution=arbitrary"]
    srun += ["--kill-on-bad-exit=1", "--overlap", "--label", "--unbuffered"]
    env = {
        **os.environ,
        "SLURM_HOSTFILE": str(hostfile),
        "MASTER_ADDR": nodes[node_of_rank[0]],
        "MASTER_PORT": str(slurm_port(job)),
    }
    if interface:
        env.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
    log = srun_log(log_dir)
    supervise([start_logged([*srun, *main.command()], log, env)], [log], timeout_s, "srun of all ranks")


def bind_task_link(env: RankEnv) -> None:
    """In an srun task: bind gloo and NCCL to the named interface, else the one routing to rank 0's node,
    and name that interface and this node's index for the link counters (``RALP_PIPE_LINK``/``RALP_PIPE_HOST``)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME") or route_interface(env.master_addr)
    if interface == "lo" and env.world_size > 1:
        raise RunFailure(
            f"rank {env.rank}: rank 0's node {env.master_addr!r} is reached through the loopback interface here "
            f"(its name resolves to a local address), so other nodes could not reach it; name the fabric's "
            f"interface with network.interface"
        )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    os.environ[LINK_ENV], os.environ[HOST_ENV] = interface, str(env.node)
