"""TensorFlow's gRPC transport between two emulated hosts, against a plain TCP stream on the same link.

Run by path inside a host (the harness starts it): ``serve`` starts task 1 of a two-task cluster and
holds a float32 variable of ``--mb`` MB; ``client`` starts task 0 and copies that variable into one of
its own (``local.assign(remote)``, the read of a distributed_replicated worker: one RecvTensor over
gRPC) ``--warmup`` + ``--copies`` times, each in its own ``Session.run``, and prints the copies' bytes and
seconds as JSON. ``tcp-recv`` / ``tcp-send`` move the same bytes over one plain TCP stream (Python
sockets) for the link's TCP payload rate. The harness (:func:`measure`) runs both at each rate and
reports TF's rate as a share of the TCP stream's and of the tc rate.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

PORT, TCP_PORT = 2300, 2400
BLOCK = 1 << 20


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow.compat.v1 as tf

    tf.disable_eager_execution()
    return tf


def _config(tf: Any) -> Any:
    config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # nothing may skip the transfer
    return config


def _serve(args: argparse.Namespace) -> None:
    tf = _tf()
    cluster = tf.train.ClusterSpec({"t": args.hosts.split(",")})
    tf.distribute.Server(cluster, "t", 1, config=_config(tf), start=True).join()


def _client(args: argparse.Namespace) -> None:
    tf = _tf()
    cluster = tf.train.ClusterSpec({"t": args.hosts.split(",")})
    server = tf.distribute.Server(cluster, "t", 0, config=_config(tf), start=True)
    values = int(args.mb * 1e6 // 4)
    with tf.device("/job:t/task:1/cpu:0"):
        remote = tf.get_variable("remote", [values], initializer=tf.ones_initializer(), use_resource=False)
    with tf.device("/job:t/task:0/cpu:0"):
        local = tf.get_variable("local", [values], initializer=tf.zeros_initializer(), use_resource=False)
        copy = local.assign(remote).op
    with tf.Session(server.target, config=_config(tf)) as session:
        session.run(tf.global_variables_initializer())
        for _ in range(args.warmup):
            session.run(copy)
        seconds = []
        for _ in range(args.copies):
            began = time.perf_counter()
            session.run(copy)
            seconds.append(time.perf_counter() - began)
    print(json.dumps({"bytes": values * 4, "seconds": seconds}), flush=True)


def _tcp_recv(args: argparse.Namespace) -> None:
    server = socket.create_server((args.address, TCP_PORT))
    print("listening", flush=True)
    conn, _ = server.accept()
    received, began = 0, None
    while chunk := conn.recv(BLOCK):
        began = began or time.perf_counter()
        received += len(chunk)
    print(json.dumps({"bytes": received, "seconds": [time.perf_counter() - (began or 0.0)]}), flush=True)


def _tcp_send(args: argparse.Namespace) -> None:
    conn = socket.create_connection((args.address, TCP_PORT), timeout=60)
    block, left = bytes(BLOCK), int(args.mb * 1e6)
    while left > 0:
        left -= conn.send(block[: min(left, BLOCK)])
    conn.close()


def client_beside_server(cluster: Any, command: Sequence[str], options: Sequence[str], log: Path) -> list[dict]:
    """Run ``COMMAND serve`` as task 1 on host 1 of `cluster` and ``COMMAND client`` as task 0 on host 0, both
    with ``--hosts`` and `options`; the client's output goes to `log`. Returns the JSON lines it printed (a
    failed client raises, naming `log`)."""
    import subprocess

    from ralp_pipe.runtime.process import start, stop, wait_all

    hosts = ["--hosts", f"{cluster.address(0)}:{PORT},{cluster.address(1)}:{PORT}"]
    env = [{**os.environ, **cluster.env(h)} for h in range(2)]
    serve = start([*cluster.prefix(1), *command, "serve", *hosts, *options], env[1])
    with open(log, "wb") as handle:
        client = start(
            [*cluster.prefix(0), *command, "client", *hosts, *options], env[0], stdout=handle, stderr=subprocess.STDOUT
        )
    try:
        codes = wait_all([client], 900)
    finally:
        stop([client, serve])
    if codes != [0]:
        raise RuntimeError(f"the TensorFlow client failed; see {log}")
    return [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]


def measure(rates: Sequence[str], mb: float, copies: int, out: Path, python: str = sys.executable) -> list[dict]:
    """At each of `rates`: TF's gRPC copy rate and a TCP stream's rate between two emulated hosts."""
    import subprocess

    from ralp_pipe.config.units import rate_bits_per_s
    from ralp_pipe.runtime.emulated import EmulatedCluster
    from ralp_pipe.runtime.process import start, wait_all

    script = str(Path(__file__).resolve())
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in rates:
        with EmulatedCluster(2, rate) as cluster:
            env = [{**os.environ, **cluster.env(h)} for h in range(2)]
            # the TCP stream first: one receiver on host 1, one sender on host 0
            receiver = start(
                [*cluster.prefix(1), python, script, "tcp-recv", "--address", cluster.address(1)],
                env[1],
                stdout=subprocess.PIPE,
            )
            assert receiver.stdout is not None
            receiver.stdout.readline()
            sender = start(
                [*cluster.prefix(0), python, script, "tcp-send", "--address", cluster.address(1), "--mb", str(mb)],
                env[0],
            )
            wait_all([sender, receiver], 600)
            tcp = json.loads(receiver.stdout.read())
            receiver.stdout.close()
            log = out / f"tf-{rate}.log"
            lines = client_beside_server(cluster, [python, script], ["--mb", str(mb), "--copies", str(copies)], log)
            if not lines:
                raise RuntimeError(f"the TF transfer at {rate} failed; see {log}")
            grpc = lines[-1]
        tcp_bps = tcp["bytes"] * 8 / tcp["seconds"][0]
        grpc_bps = [grpc["bytes"] * 8 / s for s in grpc["seconds"]]
        link = None if rate == "unlimited" else rate_bits_per_s(rate, "rate")
        row = {
            "rate": rate,
            "link_bits_per_s": link,
            "tensor_mb": mb,
            "tcp_payload_bits_per_s": tcp_bps,
            "grpc_bits_per_s": grpc_bps,
            "grpc_over_tcp": [b / tcp_bps for b in grpc_bps],
            "grpc_over_link": None if link is None else [b / link for b in grpc_bps],
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the command named in `argv` (inside an emulated host)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True)
    for name, run in (("serve", _serve), ("client", _client)):
        command = commands.add_parser(name)
        command.add_argument("--hosts", required=True, help="HOST:PORT of task 0 and task 1")
        command.add_argument("--mb", type=float, default=100.0)
        command.add_argument("--warmup", type=int, default=1)
        command.add_argument("--copies", type=int, default=3)
        command.set_defaults(run=run)
    for name, run in (("tcp-recv", _tcp_recv), ("tcp-send", _tcp_send)):
        command = commands.add_parser(name)
        command.add_argument("--address", required=True)
        command.add_argument("--mb", type=float, default=100.0)
        command.set_defaults(run=run)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])


def caps(row: dict[str, Any]) -> list[float]:
    """gRPC's own rate (bits/s) in each copy of `row`: each byte costs the link's time (the TCP stream's) plus the
    transport's, so 1/gRPC = 1/TCP + 1/cap (``strategy.transport_cap``); a copy as fast as the stream gives none."""
    tcp = row["tcp_payload_bits_per_s"]
    return [1 / (1 / g - 1 / tcp) for g in row["grpc_bits_per_s"] if g < tcp]


def cap_of(rows: Sequence[dict[str, Any]]) -> float:
    """The cap `dtf` runs with on this machine: the median over every copy at every rate (:func:`caps`)."""
    every = [c for row in rows for c in caps(row)]
    if not every:
        raise ValueError("no gRPC copy was slower than the TCP stream: no cap to measure")
    return statistics.median(every)


def cap_of_record(path: Path) -> str:
    """:func:`cap_of` of a transport record (``--transport``'s transport.json) as a tc rate."""
    return f"{cap_of(json.loads(path.read_text())['figures']['rates']) / 1e9:.2f}gbit"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The transport rows as a Markdown table: each rate's TCP stream and gRPC copies, their ratios."""

    def span(values: Sequence[float] | None, spec: str) -> str:
        return "-" if not values else f"{min(values):{spec}}-{max(values):{spec}}"

    lines = [
        "| rate | TCP stream Gbit/s | TF gRPC copy Gbit/s (copies) | gRPC / TCP | gRPC / tc rate | cap Gbit/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        grpc = [b / 1e9 for b in r["grpc_bits_per_s"]]
        lines.append(
            f"| {r['rate']} | {r['tcp_payload_bits_per_s'] / 1e9:.3f} | {span(grpc, '.2f')} "
            f"| {span(r['grpc_over_tcp'], '.2f')} | {span(r['grpc_over_link'], '.2f')} "
            f"| {span([c / 1e9 for c in caps(r)], '.1f')} |"
        )
    lines.append(f"\ngRPC's cap, the median of every copy: {cap_of(rows) / 1e9:.2f} Gbit/s (1/gRPC = 1/TCP + 1/cap).")
    return "\n".join(lines) + "\n"
