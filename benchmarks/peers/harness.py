"""The peer harness: real reference systems beside ralp-pipe's strategies on the same emulated network.

Every run gets a fresh emulated cluster of ralp-pipe's own making
(:class:`ralp_pipe.runtime.emulated.EmulatedCluster`: one network namespace per host, ``tc tbf`` on
both directions of every host link) and reads each host link's kernel byte counters
(:mod:`ralp_pipe.runtime.wire`) at the edges of its measured window. Peers:

- ``tf_ps`` / ``tf_replicated``: Distributed TensorFlow's parameter servers with TensorFlow's own
  runtime (:mod:`tf_ps`), one PS task beside one worker on every host, variable update
  ``parameter_server`` / ``distributed_replicated``; compared with ``ralp-pipe train strategy=dtf``.
- ``ddp``: PyTorch DistributedDataParallel over gloo, one rank per host (:mod:`ddp_rank`); compared
  with ``ralp-pipe train strategy=allreduce``.

All run undilated with real computation on this machine's CPUs, the same model, batch, image size,
N and link rate, and every process of a run gets an even share of the CPUs (as ralp-pipe's ranks get).
The planner's prediction comes from ``ralp-pipe profile`` (a measured CPU profile) and ``ralp-pipe plan``
for the same configuration.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ralp_pipe.runtime.emulated import EmulatedCluster
from ralp_pipe.runtime.hardware import threads_per_rank
from ralp_pipe.runtime.process import start, stop, wait_all

HERE = Path(__file__).resolve().parent
PEERS = {"tf_ps": "dtf", "tf_replicated": "dtf", "ddp": "allreduce"}  # peer -> the ralp-pipe strategy beside it
TF_UPDATE = {"tf_ps": "parameter_server", "tf_replicated": "distributed_replicated"}
TF_PORTS = (2222, 2223)  # PS task, worker task: on each host's own address
DDP_PORT = 29500
RUN_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Setting:
    """One configuration every system runs: model, batch, image size, hosts N and link rate."""

    model: str
    hosts: int
    rate: str  # a tc rate (200mbit, 1gbit) or "unlimited"
    batch: int = 8
    image_size: int = 224
    classes: int = 1000
    warmup: int = 1
    steps: int = 3
    # `dtf`'s costs measured here on TensorFlow, as overrides: gRPC's cap (transport.py), its PS task's CPU (ps_cpu.py)
    dtf: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.model}-n{self.hosts}-{self.rate}-b{self.batch}-s{self.image_size}"


@dataclass(frozen=True)
class Measured:
    """What one run of one system measured."""

    system: str
    images_per_sec: float
    step_s: list[float]
    loss: list[float]
    busiest_tx_mb: float  # per step, the most any host link sent (upload) ...
    busiest_rx_mb: float  # ... and received (download)
    parameters: int
    wall_s: float
    load: float = math.nan  # the machine's 1-minute load average as the run ended (other work on the same cores)


def _busiest(per_host: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The largest tx and rx of the host links, MB per step."""
    if not per_host:
        return math.nan, math.nan
    return max(tx for tx, _ in per_host) / 1e6, max(rx for _, rx in per_host) / 1e6


def _reports(logs: Sequence[Path], what: str) -> list[dict[str, Any]]:
    """The JSON line each worker printed last, or an error naming the worker and its log's tail."""
    found = []
    for i, log in enumerate(logs):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
        if not lines:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{what} worker {i} reported nothing; last lines of {log}:\n{tail}")
        found.append(json.loads(lines[-1]))
    return found


def _measured(system: str, setting: Setting, reports: Sequence[dict[str, Any]], wall: float) -> Measured:
    window = max(r["window_s"] for r in reports)
    per_host = []
    for r in reports:
        before, after = r["counters"]
        if before is not None and after is not None:
            per_host.append(((after[0] - before[0]) / setting.steps, (after[1] - before[1]) / setting.steps))
    tx, rx = _busiest(per_host)
    return Measured(
        system=system,
        images_per_sec=setting.hosts * setting.batch * setting.steps / window,
        step_s=[max(s) for s in zip(*(r["step_s"] for r in reports))],
        loss=list(reports[0]["loss"]),
        busiest_tx_mb=tx,
        busiest_rx_mb=rx,
        parameters=int(reports[0]["parameters"]),
        wall_s=wall,
        load=os.getloadavg()[0],
    )


def _common_args(setting: Setting, threads: int) -> list[str]:
    return [
        f"--model={setting.model}",
        f"--classes={setting.classes}",
        f"--batch={setting.batch}",
        f"--size={setting.image_size}",
        f"--warmup={setting.warmup}",
        f"--steps={setting.steps}",
        f"--threads={threads}",
    ]


def run_peer(peer: str, setting: Setting, out: Path, python: str = sys.executable) -> Measured:
    """Run `peer` (a :data:`PEERS` key) once in a fresh emulated cluster; logs go below `out`."""
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with EmulatedCluster(setting.hosts, setting.rate) as cluster:
        hosts = range(setting.hosts)
        if peer in TF_UPDATE:
            threads = threads_per_rank(2 * setting.hosts)
            ps = ",".join(f"{cluster.address(h)}:{TF_PORTS[0]}" for h in hosts)
            workers = ",".join(f"{cluster.address(h)}:{TF_PORTS[1]}" for h in hosts)
            common = [
                f"--ps={ps}",
                f"--workers={workers}",
                f"--update={TF_UPDATE[peer]}",
                *_common_args(setting, threads),
            ]
            script = str(HERE / "tf_ps.py")
            servers = [(h, [python, script, "ps", f"--task={h}", *common]) for h in hosts]
            ranks = [(h, [python, script, "worker", f"--task={h}", *common]) for h in hosts]
        elif peer == "ddp":
            threads = threads_per_rank(setting.hosts)
            master = f"{cluster.address(0)}:{DDP_PORT}"
            script = str(HERE / "ddp_rank.py")
            servers = []
            ranks = [
                (h, [python, script, f"--rank={h}", f"--world={setting.hosts}", f"--master={master}"]) for h in hosts
            ]
            ranks = [(h, [*argv, *_common_args(setting, threads)]) for h, argv in ranks]
        else:
            raise ValueError(f"unknown peer {peer!r}; choose one of {', '.join(PEERS)}")
        background = [_start(cluster, h, argv, out / f"ps{h}.log") for h, argv in servers]
        logs = [out / f"worker{h}.log" for h, _ in ranks]
        procs = [_start(cluster, h, argv, log) for (h, argv), log in zip(ranks, logs)]
        try:
            codes = wait_all([*procs], RUN_TIMEOUT_S)
        finally:
            stop([*procs, *background])
        if codes != [0] * len(procs):
            tails = "\n".join(
                f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]) for log in logs
            )
            raise RuntimeError(f"{peer} on {setting.label} failed with exit codes {codes}:\n{tails}")
        reports = _reports(logs, peer)
    return _measured(peer, setting, reports, time.perf_counter() - began)


def _start(cluster: EmulatedCluster, host: int, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **cluster.env(host), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as handle:
        return start([*cluster.prefix(host), *argv], env, stdout=handle, stderr=subprocess.STDOUT)


def _ralp_pipe(argv: list[str], log: Path, python: str = sys.executable) -> None:
    """`ralp-pipe ARGV` as a child that dies with this process; its output in `log`, its tail in the error."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as handle:
        child = start([python, "-m", "ralp_pipe.cli", *argv], None, stdout=handle, stderr=subprocess.STDOUT)
    if wait_all([child], RUN_TIMEOUT_S) != [0]:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"`ralp-pipe {' '.join(argv)}` failed:\n{tail}")


def ralp_overrides(setting: Setting) -> list[str]:
    """The `ralp-pipe` overrides of `setting`: emulated hosts at its rate, synthetic in-memory batches."""
    rate = [] if setting.rate == "unlimited" else [f"network.rate={setting.rate}"]
    return [
        "cluster=emulated",
        "network=1gbit",
        f"network.name={setting.rate}",
        *rate,
        f"model={setting.model}",
        f"dataset={'synthetic1k' if setting.classes == 1000 else 'synthetic22k'}",
        f"cluster.gpus={setting.hosts}",
        f"train.batch_size={setting.batch}",
        f"train.image_size={setting.image_size}",
        f"train.warmup_steps={setting.warmup}",
        f"train.measure_steps={setting.steps}",
        "train.loader=synthetic",
    ]


def strategy_overrides(strategy: str, setting: Setting) -> list[str]:
    """`strategy=<strategy>`, and for `dtf` the costs the setting measured here."""
    return [f"strategy={strategy}", *(setting.dtf if strategy == "dtf" else ())]


def run_ours(strategy: str, setting: Setting, out: Path, python: str = sys.executable) -> Measured:
    """`ralp-pipe train strategy=<strategy>` once on `setting` (undilated, real computation), into `out`."""
    if setting.rate == "unlimited":
        raise ValueError("ralp-pipe's emulated runs need a link rate; give the peers one too")
    began = time.perf_counter()
    _ralp_pipe(
        ["train", "--out", str(out), *ralp_overrides(setting), *strategy_overrides(strategy, setting)],
        out.with_suffix(".log"),
        python,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    per_host = metrics["wire_per_host"].values()
    tx, rx = _busiest([(link["tx"] * 1e9, link["rx"] * 1e9) for link in per_host])
    return Measured(
        system=strategy,
        images_per_sec=float(metrics["images_per_sec"]),
        step_s=[],
        loss=[],
        busiest_tx_mb=tx,
        busiest_rx_mb=rx,
        parameters=int(metrics.get("parameters", 0) or 0),
        wall_s=time.perf_counter() - began,
        load=os.getloadavg()[0],
    )


def predict(setting: Setting, out: Path, python: str = sys.executable) -> dict[str, float]:
    """The planner's images/sec of `dtf` and `allreduce` on `setting`, from a CPU profile measured here."""
    out.mkdir(parents=True, exist_ok=True)
    profile, plan = out / "profile.json", out / "plan.json"
    overrides = [
        *ralp_overrides(setting),
        *strategy_overrides("dtf", setting),  # allreduce's options: its shipped config
        "experiment.strategies=[dtf,allreduce]",
        "experiment.sequential=[]",
    ]
    for argv in (
        ["profile", "--out", str(profile), *overrides],
        ["plan", "--profile", str(profile), "--out", str(plan), *overrides],
    ):
        if not (out / argv[2]).exists() or argv[0] == "plan":
            _ralp_pipe(argv, out / f"{argv[0]}.log", python)
    entries = json.loads(plan.read_text())["by_gpus"][str(setting.hosts)]
    return {name: float(entry["predicted_images_per_sec"]) for name, entry in entries.items()}


def record(setting: Setting, repeat: int, peer: Measured, ours: Measured | None, predicted: float | None) -> dict:
    """One row of the table: the setting, the peer, ralp-pipe beside it and the prediction."""
    row: dict[str, Any] = {k: v for k, v in asdict(setting).items()}
    row.update(
        repeat=repeat,
        peer=peer.system,
        strategy=PEERS[peer.system],
        peer_images_per_sec=peer.images_per_sec,
        peer_loss_first=peer.loss[0] if peer.loss else math.nan,
        peer_loss_last=peer.loss[-1] if peer.loss else math.nan,
        peer_parameters=peer.parameters,
        peer_busiest_tx_mb=peer.busiest_tx_mb,
        peer_busiest_rx_mb=peer.busiest_rx_mb,
        peer_step_s=json.dumps([round(s, 4) for s in peer.step_s]),
        ours_images_per_sec=ours.images_per_sec if ours else math.nan,
        ours_busiest_tx_mb=ours.busiest_tx_mb if ours else math.nan,
        ours_busiest_rx_mb=ours.busiest_rx_mb if ours else math.nan,
        predicted_images_per_sec=math.nan if predicted is None else predicted,
        peer_wall_s=peer.wall_s,
        ours_wall_s=ours.wall_s if ours else math.nan,
        peer_load=peer.load,
        ours_load=ours.load if ours else math.nan,
    )
    row["ours_over_peer"] = row["ours_images_per_sec"] / row["peer_images_per_sec"]
    row["predicted_over_peer"] = row["predicted_images_per_sec"] / row["peer_images_per_sec"]
    return row
