"""Several training jobs at once on one emulated network, each also measured alone.

A workload is a group of k = 2 to :data:`MAX_CONCURRENT_JOBS` jobs (experiment.concurrent: a list of groups); k = 1 is each
job alone. Layout: the parameter-server ranks (PS or RALP PS device) of every job share host 0, so their
traffic meets on one host link, as when jobs share a parameter-server machine; every other
rank gets a host of its own. Each job runs as a ``ralp-pipe train`` child whose launcher
joins the shared cluster: its command line names the hosts (``--shared-hosts``, from
:meth:`ralp_pipe.runtime.emulated.EmulatedCluster.share`).
Each of ``experiment.repeats`` rounds runs every distinct job alone on the same layout (jobs with the same
overrides share one alone run: the same configuration on the same links, also across the workloads of one call),
then each workload's jobs all together. ``concurrent.json`` (one per workload)
holds each job's strategy, its measured images/sec alone and together in every round (together: windows that
started at once and a link kept loaded until the last closed, :mod:`ralp_pipe.engine.gate`) (``alone_runs``,
``together_runs``; ``alone_of``: the job whose alone runs they are, in the workload ``alone_in`` names where that is
another of the call) and their means, the slowdown (mean alone / mean together) and its dilation factor D (null
where undilated; the tables show target-equivalent figures, measured x D, with intervals, the group's k and whether
its jobs are all alike: :func:`ralp_pipe.results.tables.concurrent_table`).

CLI: ``ralp-pipe concurrent --out DIR --job "strategy=ps model=vgg11" --job "strategy=ps" [overrides]`` runs one
workload into DIR; ``--workload '["strategy=ps", "strategy=ralp_n"]' --workload '["strategy=ps", "strategy=ps"]'``
runs several, workload i into DIR/w<i> (the workflow's layout). The trailing overrides apply to every job;
``cluster=emulated`` is implied.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ralp_pipe.atomic import check_writable, write_json_atomic
from ralp_pipe.config import Config, ConfigError, load
from ralp_pipe.config.dilation import emulated_rate
from ralp_pipe.contract.layout import CONCURRENT_FILE, CONCURRENT_ID, MAX_CONCURRENT_JOBS, METRICS_FILE
from ralp_pipe.contract.records import RunMetrics
from ralp_pipe.contract.topology import of_strategy
from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.process import start_logged, stop, wait_all

SHARED_HOST = 0


def layout(configs: Sequence[Config]) -> tuple[list[list[int]], int]:
    """Host of every rank of every job (server ranks on the shared host 0) and the number of hosts."""
    hosts, next_host = [], SHARED_HOST + 1
    for cfg in configs:
        topo = of_strategy(cfg.strategy, cfg.cluster.gpus)
        placed = []
        for rank in range(topo.world_size):
            if rank in topo.ps:
                placed.append(SHARED_HOST)
            else:
                placed.append(next_host)
                next_host += 1
        hosts.append(placed)
    return hosts, next_host


def train_command(out: Path, overrides: Sequence[str], shared: list[dict[str, Any]]) -> list[str]:
    """argv of one job's ``ralp-pipe train``: its ranks on the `shared` hosts (:meth:`EmulatedCluster.share`)."""
    placed = ["--shared-hosts", json.dumps(shared)]
    return [sys.executable, "-m", "ralp_pipe.cli", "train", "--out", str(out), *placed, *overrides]


def _run_jobs(cluster: EmulatedCluster, jobs: Sequence[tuple[Path, list[str], list[int]]], timeout_s: float) -> None:
    """Run ``(out, overrides, hosts)`` train jobs at once on `cluster`; raise if any fails."""
    procs, logs = [], []
    try:
        for out, overrides, hosts in jobs:
            out.mkdir(parents=True, exist_ok=True)
            logs.append(out / "train.log")
            command = train_command(out, overrides, cluster.share(hosts, master_host=hosts[0]))
            procs.append(start_logged(command, logs[-1]))
        codes = wait_all(procs, timeout_s, fail_fast=True)
    finally:
        stop(procs)
    failed = [str(logs[i]) for i, code in enumerate(codes) if code != 0]
    if failed:
        raise RunFailure(f"concurrent training jobs failed (exit {codes}); see {', '.join(failed)}")


def _record(out: Path) -> RunMetrics:
    return RunMetrics.read(out / METRICS_FILE)


def check_group(jobs: Sequence[Sequence[str]], where: str) -> None:
    """Refuse a workload of fewer than 2 or more than :data:`MAX_CONCURRENT_JOBS` jobs (`where` names it in the error)."""
    if not 2 <= len(jobs) <= MAX_CONCURRENT_JOBS:
        raise ConfigError(
            f"{where} has {len(jobs)} jobs: a concurrent workload runs 2 to {MAX_CONCURRENT_JOBS} jobs at once (each job alone "
            f"is k = 1)"
        )


@dataclass(frozen=True)
class Workload:
    """One workload of a call: its jobs' full overrides and configs, the host of each rank and the hosts in all,
    the network they share (tc rate and burst) and the folder it is written to."""

    overrides: list[list[str]]
    configs: list[Config]
    hosts: list[list[int]]
    n_hosts: int
    network: tuple[str, str]
    out: Path


def _workload(jobs: Sequence[Sequence[str]], common: Sequence[str], out: Path, where: str) -> Workload:
    """Compose a workload's jobs (each on the emulated network), refusing a bad count or jobs on different networks."""
    check_group(jobs, where)
    overrides = [[*common, "cluster=emulated", *job] for job in jobs]
    configs = [load(o) for o in overrides]
    networks = {(emulated_rate(c), c.network.burst) for c in configs}
    if len(networks) != 1:
        raise ConfigError(
            f"the jobs of {where} ask for different networks (tc rate and burst, dilated: network.rate / "
            f"dilation.factor) {sorted(networks)}; they must share one network"
        )
    hosts, n_hosts = layout(configs)
    return Workload(overrides, configs, hosts, n_hosts, networks.pop(), out)


def run_workloads(
    workloads: Sequence[Sequence[Sequence[str]]], common: Sequence[str], outs: Sequence[Path]
) -> list[dict[str, Any]]:
    """Run workload w (its jobs' overrides + `common`) into ``outs[w]``, experiment.repeats rounds: each round every
    distinct job of them all alone once (on the layout of the first workload that has it), then each workload's jobs
    all together; write and return each workload's concurrent.json."""
    where = ["--job"] if len(workloads) == 1 else [f"--workload {w} ({outs[w]})" for w in range(len(workloads))]
    groups = [_workload(jobs, common, out, name) for jobs, out, name in zip(workloads, outs, where)]
    configs = [c for group in groups for c in group.configs]
    timeout_s = max(c.cluster.timeout_s for c in configs)
    repeats = max(c.experiment.repeats for c in configs)
    home: dict[tuple[str, ...], tuple[int, int]] = {}  # each distinct job -> the (workload, job) that runs it alone
    for w, jobs in enumerate(workloads):
        for i, job in enumerate(jobs):
            home.setdefault(tuple(job), (w, i))
    for r in range(repeats):
        for w, i in home.values():
            group = groups[w]
            with EmulatedCluster(group.n_hosts, *group.network) as cluster:
                _run_jobs(
                    cluster, [(_run_dir(group.out, i, r, "alone"), group.overrides[i], group.hosts[i])], timeout_s
                )
        for group in groups:
            gate = group.out / f"r{r}-gate"  # where the jobs meet, so that their windows run together (engine/gate.py)
            shutil.rmtree(gate, ignore_errors=True)  # a fresh meeting each round
            met = [f"train.gate={gate}", f"train.gate_jobs={len(group.configs)}"]
            at_once = [
                (_run_dir(group.out, i, r, "together"), [*o, *met], group.hosts[i])
                for i, o in enumerate(group.overrides)
            ]
            with EmulatedCluster(group.n_hosts, *group.network) as cluster:
                _run_jobs(cluster, at_once, timeout_s)
    summaries = []
    for w, (jobs, group) in enumerate(zip(workloads, groups)):
        summary: dict[str, Any] = {
            "network": {"rate": group.network[0], "burst": group.network[1]},
            "shared_host": SHARED_HOST,
            "repeats": repeats,
            "jobs": [],
        }
        for i, job in enumerate(jobs):
            alone_w, alone_i = home[tuple(job)]
            alone = [_record(_run_dir(groups[alone_w].out, alone_i, r, "alone")) for r in range(repeats)]
            together = [_record(_run_dir(group.out, i, r, "together")) for r in range(repeats)]
            alone_runs = [m.images_per_sec for m in alone]
            together_runs = [m.images_per_sec for m in together]
            alone_mean, together_mean = sum(alone_runs) / repeats, sum(together_runs) / repeats
            summary["jobs"].append(
                {
                    "job": i,
                    "overrides": list(job),
                    "strategy": group.configs[i].strategy.name,
                    "hosts": group.hosts[i],
                    "alone_of": alone_i,
                    **({} if alone_w == w else {"alone_in": groups[alone_w].out.name}),
                    "alone_runs": alone_runs,
                    "together_runs": together_runs,
                    "alone_images_per_sec": alone_mean,
                    "together_images_per_sec": together_mean,
                    "slowdown": alone_mean / together_mean,
                    # D of both runs (its fixed dilation.factor; null: undilated): target-equivalent = images/sec x D
                    "dilation_factor": (alone[0].dilation or {}).get("factor"),
                }
            )
        write_json_atomic(group.out / CONCURRENT_FILE, summary)
        summaries.append(summary)
    return summaries


def run_concurrent(jobs: Sequence[Sequence[str]], common: Sequence[str], out: Path) -> dict[str, Any]:
    """Run one workload (:func:`run_workloads`) into `out`; return its concurrent.json."""
    return run_workloads([jobs], common, [out])[0]


def _run_dir(out: Path, job: int, repeat: int, side: str) -> Path:
    """Folder of job `job`'s run `side` (alone / together) in round `repeat`."""
    return out / f"job{job}" / f"r{repeat}" / side


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the `concurrent` stage."""
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for job*/r*/alone|together and concurrent.json (--workload: w*/)",
    )
    jobs = parser.add_mutually_exclusive_group(required=True)
    jobs.add_argument(
        "--job",
        action="append",
        metavar="OVERRIDES",
        help='one job\'s Hydra overrides as one quoted string, e.g. --job "strategy=ps model=vgg11"; repeat per job',
    )
    jobs.add_argument(
        "--workload",
        action="append",
        metavar="JSON",
        help='one workload as a JSON list of its jobs\' overrides, e.g. \'["strategy=ps", "strategy=ralp_n"]\'; repeat '
        "per workload: workload i is written to OUT/w<i>, and a job of several workloads runs alone once a round",
    )


def parse_workload(text: str, index: int) -> list[list[str]]:
    """The jobs of ``--workload`` number `index`: a JSON list of override strings, each split as a shell would."""
    try:
        jobs = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--workload {index} is not JSON ({exc}): give a list of quoted override strings") from None
    if not isinstance(jobs, list) or not all(isinstance(job, str) for job in jobs):
        raise ConfigError(f"--workload {index} must be a JSON list of override strings, got {text!r}")
    return [shlex.split(job) for job in jobs]


def main(args: argparse.Namespace) -> int:
    """Run the `concurrent` stage and print each job's slowdown."""
    check_writable(args.out, f"--out {args.out}")
    if args.job:
        workloads, outs = [[shlex.split(job) for job in args.job]], [args.out]
    else:
        workloads = [parse_workload(text, i) for i, text in enumerate(args.workload)]
        outs = [args.out / CONCURRENT_ID.format(index=i) for i in range(len(workloads))]
    summaries = run_workloads(workloads, args.overrides, outs)
    for out, summary in zip(outs, summaries):
        for job in summary["jobs"]:
            factor = job["dilation_factor"]
            # a dilated job's figures are the emulator's wall clock: the target's are D times them (summary.md shows those)
            dilated = (
                "" if factor is None else f" (emulator wall clock at D={factor:g}; target-equivalent: x {factor:g})"
            )
            print(
                f"{out} job {job['job']} ({' '.join(job['overrides'])}): alone {job['alone_images_per_sec']:.2f} img/s, "
                f"together {job['together_images_per_sec']:.2f} img/s, slowdown {job['slowdown']:.2f}x{dilated}, "
                f"mean of {summary['repeats']} rounds, k={len(summary['jobs'])}"
            )
    return 0
