"""Harness for the emulated-network tests and benchmarks: commands on hosts, raw TCP link-rate probes, qdisc figures."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from ralp_pipe.runtime.emulated import EmulatedCluster, EmulationUnavailable
from ralp_pipe.runtime.process import Process, start, stop, wait_all
from ralp_pipe.runtime.wire import INTERFACE, LinkCounters, interface_counters

_RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = server.accept()
received, start = 0, None
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    start = start or time.perf_counter()
    received += len(chunk)
print(received, time.perf_counter() - start, flush=True)
"""

_SENDER = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
block, left = bytes(1 << 20), int(sys.argv[3])
while left > 0:
    left -= conn.send(block[: min(left, len(block))])
conn.close()
"""


def measure_link_rates(
    cluster: EmulatedCluster,
    streams: Sequence[tuple[int, int]],
    nbytes: int,
    port: int = 5201,
    python: str = sys.executable,
) -> list[float]:
    """Achieved TCP payload rate in bit/s of each `(src, dst)` Python socket stream of `nbytes`, all at once.

    Every receiver listens (stream i on `port` + i) before any sender starts; each receiver's clock
    runs from its first byte to the end of its stream.
    """
    receivers: list[Process] = []
    try:
        for i, (_, dst) in enumerate(streams):
            argv = [python, "-c", _RECEIVER, cluster.address(dst), str(port + i)]
            receivers.append(start_on_host(cluster, dst, argv, stdout=subprocess.PIPE))
            assert receivers[-1].stdout is not None
            if receivers[-1].stdout.readline().strip() != b"listening":
                raise RuntimeError(f"the link-rate receiver on host {dst} did not start")
        senders = [
            start_on_host(cluster, src, [python, "-c", _SENDER, cluster.address(dst), str(port + i), str(nbytes)])
            for i, (src, dst) in enumerate(streams)
        ]
        if wait_all([*senders, *receivers], max(60.0, nbytes * 8 / 1e7)) != [0] * (2 * len(streams)):
            raise RuntimeError(f"the link-rate probe of streams {list(streams)} failed")
        rates = []
        for receiver in receivers:
            assert receiver.stdout is not None
            received, seconds = receiver.stdout.read().split()
            rates.append(int(received) * 8 / float(seconds))
        return rates
    finally:
        stop(receivers)
        for receiver in receivers:
            if receiver.stdout is not None:
                receiver.stdout.close()


def measure_link_rate(
    cluster: EmulatedCluster, src: int, dst: int, nbytes: int, port: int = 5201, python: str = sys.executable
) -> float:
    """Achieved TCP payload rate in bit/s of one Python socket stream of `nbytes` from `src` to `dst` (one direction)."""
    return measure_link_rates(cluster, [(src, dst)], nbytes, port, python)[0]


def read_counters(cluster: EmulatedCluster) -> list[LinkCounters]:
    """Per host, the kernel's tx/rx byte counters of its link (from its namespace's /proc/net/dev)."""
    return [interface_counters(f"/proc/{pid}/net/dev") for pid in cluster.namespace_pids()]


def counter_delta(before: Sequence[LinkCounters], after: Sequence[LinkCounters]) -> list[LinkCounters]:
    """Bytes sent and received per host between two :func:`read_counters` readings."""
    return [LinkCounters(a.tx_bytes - b.tx_bytes, a.rx_bytes - b.rx_bytes) for b, a in zip(before, after)]


def qdisc_stats(cluster: EmulatedCluster) -> dict[str, dict[str, Any]]:
    """`tc -s` figures of the root qdisc at both ends of every host link.

    Keys: ``h<i>`` for host i's ``eth0`` (its upload), ``s<i>`` for the switch's port to it (its
    download). Values: ``kind``, ``bytes`` sent, and for tbf ``rate`` (bytes/s) and ``burst`` (bytes).
    """
    found: dict[str, dict[str, Any]] = {}
    sides = [
        (f"h{i}", cluster.run(i, ["tc", "-s", "-j", "qdisc", "show", "dev", INTERFACE])) for i in range(cluster.hosts)
    ]
    sides.append(("switch", cluster.switch_run(["tc", "-s", "-j", "qdisc", "show"])))
    for side, shown in sides:
        if shown.returncode != 0:
            raise RuntimeError(f"tc -s qdisc show failed on {side}: {shown.stderr.strip()}")
        for qdisc in json.loads(shown.stdout):
            name = qdisc["dev"] if side == "switch" else side
            if not qdisc.get("root") or (side == "switch" and not re.fullmatch(r"s\d+", name)):
                continue  # the switch's loopback and bridge carry no host link
            options = qdisc.get("options", {})
            found[name] = {
                "kind": qdisc["kind"],
                "bytes": qdisc["bytes"],
                "rate": options.get("rate"),
                "burst": options.get("burst"),
            }
    return found


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while inside, so clean-up code runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_on_host(
    cluster: EmulatedCluster,
    host: int,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: int | None = None,
) -> Process:
    """Start `argv` inside `host` in a session of its own, with the rank environment added."""
    full_env = {**os.environ, **cluster.env(host), **(env or {})}
    return start([*cluster.prefix(host), *argv], full_env, stdout=stdout)


def run_on_hosts(
    commands: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]] | None = None,
    rate: str = "unlimited",
    burst: str = "1mb",
    timeout: float = 600,
    fail_fast: bool = True,
) -> tuple[list[int], list[LinkCounters]]:
    """Run command i on host i of a fresh emulated cluster; return exit codes and bytes per host link."""
    envs = envs or [{} for _ in commands]
    if len(envs) != len(commands):
        raise ValueError(f"{len(commands)} commands but {len(envs)} environments")
    procs: list[Process] = []
    with _sigterm_as_interrupt(), EmulatedCluster(len(commands), rate, burst) as cluster:
        try:
            before = read_counters(cluster)
            procs = [start_on_host(cluster, i, cmd, env) for i, (cmd, env) in enumerate(zip(commands, envs))]
            codes = wait_all(procs, timeout, fail_fast)
            return codes, counter_delta(before, read_counters(cluster))
        finally:
            stop(procs)


def emulation_available() -> tuple[bool, str]:
    """Whether an emulated cluster can be built here, and a sentence saying how or why not."""
    try:
        with EmulatedCluster(hosts=1, rate="1gbit") as cluster:
            shown = cluster.run(0, ["tc", "qdisc", "show", "dev", INTERFACE]).stdout
            if "tbf" not in shown:
                return False, f"tc could not attach tbf to {INTERFACE} (got {shown.strip()!r}); use cluster=local"
            return True, f"network namespaces with tc tbf ({cluster.mode})"
    except EmulationUnavailable as exc:
        return False, str(exc)
