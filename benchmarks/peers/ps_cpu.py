"""What a Distributed TensorFlow PS task's CPU spends per byte and per tensor, measured on TensorFlow itself.

Two loss terms of `dtf` that the link does not explain, each measured in TensorFlow 2.21's own runtime on this
machine's CPU (a PS task's thread settings, as the harness runs them):

- **Per byte** (``ops``): seconds of one ``ApplyMomentum`` (what each worker's push costs the PS task holding
  the variable: tf_cnn_benchmarks applies every worker's gradient separately), of one
  ``ApplyGradientDescent`` and of an ``AddN`` of two gradients (what summing one more gradient costs where
  gradients are aggregated first, as a one-host ``parameter_server`` run does), on float32 tensors of
  ``--sizes`` MB. A least-squares line through each size's median run gives seconds per byte (its slope) and per call.
- **Per tensor** (``rpc``): one ``Session.run`` on worker task 0 reads K one-value variables from PS task 1 (a
  ``tf.distribute.Server`` in another emulated host, no link limit) into local ones: K RecvTensor calls over
  gRPC. The slope of seconds against K is what one more tensor costs a step, apart from its bytes.

``python ps_cpu.py ops|client|serve ...`` is run by the harness (:func:`measure`); ``python benchmarks/peers
--ps-cpu --out DIR`` writes ``ps_cpu.json`` there (``--record`` as well: docs/records/peers-ps-cpu.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

OPS = ("apply_momentum", "apply_gradient_descent", "add_n")


def _tf(threads: int) -> tuple[Any, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow.compat.v1 as tf

    tf.disable_eager_execution()
    config = tf.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=max(2, threads))
    config.graph_options.rewrite_options.disable_meta_optimizer = True  # nothing may fold the measured op away
    return tf, config


def _timed(session: Any, op: Any, repeats: int) -> list[float]:
    """Seconds of `repeats` runs of `op` in `session`, after one untimed run."""
    session.run(op)
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        session.run(op)
        seconds.append(time.perf_counter() - began)
    return seconds


def _ops(args: argparse.Namespace) -> None:
    """Seconds of each op of :data:`OPS` at each size, `args.repeats` runs each after one warm-up; JSON lines."""
    tf, config = _tf(args.threads)
    for mb in args.sizes:
        values = int(mb * 1e6 // 4)
        graph = tf.Graph()
        with graph.as_default():

            def variable(name: str, value: float, values: int = values) -> Any:
                return tf.get_variable(name, [values], initializer=tf.constant_initializer(value), use_resource=False)

            var, accum = variable("var", 1.0), variable("accum", 0.0)
            grads = [variable(f"grad{i}", 1e-3) for i in range(2)]
            ops = {
                "apply_momentum": tf.raw_ops.ApplyMomentum(
                    var=var, accum=accum, lr=1e-3, grad=grads[0], momentum=0.9, use_locking=False
                ).op,
                "apply_gradient_descent": tf.raw_ops.ApplyGradientDescent(
                    var=var, alpha=1e-3, delta=grads[0], use_locking=False
                ).op,
                # the sum lands in a variable, as the aggregated gradient does before its apply
                "add_n": tf.assign(grads[1], tf.add_n([grads[0], grads[1]])).op,
            }
            init = tf.global_variables_initializer()
        with tf.Session(graph=graph, config=config) as session:
            session.run(init)
            for name, op in ops.items():
                for seconds in _timed(session, op, args.repeats):
                    print(json.dumps({"op": name, "bytes": values * 4, "seconds": seconds}), flush=True)


def _serve(args: argparse.Namespace) -> None:
    tf, config = _tf(args.threads)
    cluster = tf.train.ClusterSpec({"t": args.hosts.split(",")})
    tf.distribute.Server(cluster, "t", 1, config=config, start=True).join()


def _client(args: argparse.Namespace) -> None:
    """Per count K: `args.repeats` timed runs reading K one-value variables from task 1; JSON lines."""
    tf, config = _tf(args.threads)
    cluster = tf.train.ClusterSpec({"t": args.hosts.split(",")})
    server = tf.distribute.Server(cluster, "t", 0, config=config, start=True)
    reads = {}
    for count in args.counts:
        copies = []
        for i in range(count):
            with tf.device("/job:t/task:1/cpu:0"):
                remote = tf.get_variable(f"r{count}_{i}", [1], initializer=tf.ones_initializer(), use_resource=False)
            with tf.device("/job:t/task:0/cpu:0"):
                local = tf.get_variable(f"l{count}_{i}", [1], initializer=tf.zeros_initializer(), use_resource=False)
                copies.append(local.assign(remote).op)
        reads[count] = tf.group(*copies)
    with tf.Session(server.target, config=config) as session:
        session.run(tf.global_variables_initializer())
        for count, read in reads.items():
            for seconds in _timed(session, read, args.repeats):
                print(json.dumps({"tensors": count, "seconds": seconds}), flush=True)


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the median y of each distinct x (a shared machine's
    stalls hit single runs; the median of each size's repeats leaves them out)."""
    medians = {x: statistics.median(y for x2, y in zip(xs, ys) if x2 == x) for x in sorted(set(xs))}
    slope, intercept = statistics.linear_regression(list(medians), list(medians.values()))
    return intercept, slope


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(row) for row in text.splitlines() if row.startswith("{")]


def measure(
    sizes: Sequence[float], counts: Sequence[int], repeats: int, threads: int, out: Path, python: str = sys.executable
) -> dict[str, Any]:
    """Both measurements (module doc): each op's and the RecvTensor's fitted line, with every run."""
    import subprocess

    from peers.transport import client_beside_server
    from ralp_pipe.runtime.emulated import EmulatedCluster

    script = str(Path(__file__).resolve())
    out.mkdir(parents=True, exist_ok=True)
    common = ["--threads", str(threads), "--repeats", str(repeats)]
    ops = subprocess.run(
        [python, script, "ops", *common, "--sizes", *map(str, sizes)], capture_output=True, text=True, check=True
    )
    op_runs = _lines(ops.stdout)
    with EmulatedCluster(2) as cluster:
        options = [*common, "--counts", *map(str, counts)]
        rpc_runs = client_beside_server(cluster, [python, script], options, out / "ps_cpu_rpc.log")
    fits: dict[str, Any] = {}
    for name in OPS:
        runs = [r for r in op_runs if r["op"] == name]
        intercept, slope = line([r["bytes"] for r in runs], [r["seconds"] for r in runs])
        fits[name] = {"s_per_call": intercept, "s_per_byte": slope, "gbytes_per_s": 1e-9 / slope}
    intercept, slope = line([r["tensors"] for r in rpc_runs], [r["seconds"] for r in rpc_runs])
    fits["recv_tensor"] = {"s_per_run": intercept, "s_per_tensor": slope}
    return {"threads": threads, "fits": fits, "ops": op_runs, "rpc": rpc_runs}


def overrides_of_record(path: Path) -> list[str]:
    """`dtf`'s ``strategy.ps_apply_ns_per_byte`` and ``strategy.rpc_us_per_tensor`` from a record of :func:`measure`
    (three significant digits)."""
    fits = json.loads(path.read_text())["figures"]["fits"]
    apply_ns, rpc_us = fits["apply_momentum"]["s_per_byte"] * 1e9, fits["recv_tensor"]["s_per_tensor"] * 1e6
    return [f"strategy.ps_apply_ns_per_byte={apply_ns:.3g}", f"strategy.rpc_us_per_tensor={rpc_us:.3g}"]


def markdown(found: dict[str, Any]) -> str:
    """The fitted lines as a Markdown table, with each op's rate at its smallest and largest size's median run."""
    fits = found["fits"]
    lines = ["| term | per unit (the line's slope) | rate at each size, median run | fixed (the line's intercept) |"]
    lines.append("|---|---|---|---|")
    for name in OPS:
        fit, runs = fits[name], [r for r in found["ops"] if r["op"] == name]
        rates = [
            size / 1e9 / statistics.median(r["seconds"] for r in runs if r["bytes"] == size)
            for size in sorted({r["bytes"] for r in runs})
        ]
        lines.append(
            f"| {name} | {fit['s_per_byte'] * 1e9:.3f} ns/byte ({fit['gbytes_per_s']:.2f} GB/s) "
            f"| {min(rates):.2f}-{max(rates):.2f} GB/s | {fit['s_per_call'] * 1e6:.0f} us |"
        )
    rpc = fits["recv_tensor"]
    lines.append(
        f"| RecvTensor | {rpc['s_per_tensor'] * 1e6:.0f} us/tensor | - | {rpc['s_per_run'] * 1e6:.0f} us/run |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["ops", "serve", "client"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", type=float, default=[4.0])
    parser.add_argument("--counts", nargs="+", type=int, default=[1])
    parser.add_argument("--hosts", default="")
    args = parser.parse_args(argv)
    {"ops": _ops, "serve": _serve, "client": _client}[args.role](args)


if __name__ == "__main__":
    main()
